# The fused residual-add norms on one GPU, one device call (< 9 minutes):
#   1. tests/ops/fused/test_add_norm.py on the cuda backend (forward, the fused backward, routes)
#   2. python -m xkernels.bench --op add_layer_norm,add_rms_norm, bf16: forward rows and the
#      "forward+backward" rows (the fused backward against torch's y.backward(dy) with the sum's
#      gradient too) at BERT-base, Llama-3-8B, Llama-2-13B, N=1000 and decode shapes
#   3. python -m xkernels.bench --model bert-base and --model llama, ways torch and patch, bf16, 3 rounds
#      (forward and forward+backward per step)
# e.g. OUT=/tmp/out bash tools/device_runs/fused_norms.sh
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 120 python3 -m pytest tests/ops/fused/test_add_norm.py -q -x --backends cuda > $OUT/pytest-add-norm-cuda.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/pytest-add-norm-cuda.txt
timeout 170 python3 -m xkernels.bench --device cuda --op add_layer_norm,add_rms_norm --dtype bfloat16 \
  --json $OUT/bench-norms-bf16.json > $OUT/bench-norms-bf16.txt 2>&1
echo "norm bench rc=$? $(( $(date +%s)-t0 ))s"; grep -E "forward\+backward|^summary" $OUT/bench-norms-bf16.txt | cut -c1-140
for m in bert-base llama; do
  timeout 110 python3 -m xkernels.bench --model $m --way torch,patch --dtype bfloat16 --rounds 3 \
    --json $OUT/bench-$m.json > $OUT/bench-$m.txt 2>&1
  echo "$m rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^$m " $OUT/bench-$m.txt
done
