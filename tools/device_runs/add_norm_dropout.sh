# The add + norm kernels on cuda after a change to them, and the compiled form's dropout:
# 1. their suites (tests/ops/fused/test_add_norm*.py: eager, compiled form, its dropout on a known mask);
# 2. `xkernels.check` of both ops against float64;
# 3. tools/probes/norm_backward_compiled.py --dropout 0.1 (what the "compiled_dropout" rules of
#    ops/tuning/cuda/add_norm.json are written from), LayerNorm at BERT's and wider shapes;
# 4. with the time left, bench --mode compile of $MODELS (default gpt2 vit), torch and patch.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda XKERNELS_REQUIRE_MODELS=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE \
  tests/ops/fused/test_add_norm*.py > $OUT/tests-cuda-add-norm.txt 2>&1
echo "suites rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^(FAILED|ERROR)" $OUT/tests-cuda-add-norm.txt | head; tail -1 $OUT/tests-cuda-add-norm.txt
timeout 90 python3 -m xkernels.check --device cuda --op add_layer_norm,add_rms_norm --json $OUT/check-add-norm.json \
  > $OUT/check-add-norm.txt 2>&1
echo "check rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/check-add-norm.txt
timeout 200 python3 tools/probes/norm_backward_compiled.py --norms layer --dropout 0.1 \
  --shapes 8192x768 12608x768 8192x1024 8192x896 2048x4096 4096x4096 > $OUT/probe-dropout.txt 2>&1
echo "probe rc=$? $(( $(date +%s)-t0 ))s"; grep -i "compiled /\|error" $OUT/probe-dropout.txt | head -14
for m in ${MODELS:-gpt2 vit}; do
  left=$(( 570-($(date +%s)-t0) )); [ $left -lt 90 ] && { echo "$m: no time left"; continue; }
  timeout $left python3 -m xkernels.bench --model $m --mode compile --way torch,patch --dtype bf16 --rounds 3 \
    --json $OUT/bench-$m-compile.json > $OUT/bench-$m-compile.txt 2>&1
  echo "$m rc=$? $(( $(date +%s)-t0 ))s"; grep -v "^  " $OUT/bench-$m-compile.txt | tail -12
done
