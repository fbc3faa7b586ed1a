# The pre-norm add + norm sites read from any forward (xkernels/add_norm_forms.py: the sum kept as
# the next residual, Whisper's and mBART's layers) on cuda: their tests, then mBART-large (12 + 12
# layers) and Whisper-small (12 + 12, speech inputs) from committed configs, bf16, torch and patch
# in 5 interleaved rounds; then `bench --host` (every call form, the device held busy).
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_add_norm_forms.py \
  tests/harness/test_model_zoo.py > $OUT/pytest-cuda-pre-norm.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^(FAILED|ERROR)" $OUT/pytest-cuda-pre-norm.txt | head; tail -1 $OUT/pytest-cuda-pre-norm.txt
for m in mbart-large:8:512 whisper-small:8:64; do
  IFS=: read name b s <<< "$m"
  timeout 170 python3 -m xkernels.bench --model-config tools/probes/data/$name.json --way torch,patch --dtype bfloat16 \
    --batch $b --seq $s --json $OUT/bench-$name.json > $OUT/bench-$name.txt 2>&1
  echo "$name rc=$? $(( $(date +%s)-t0 ))s"; tail -5 $OUT/bench-$name.txt
done
XKERNELS_NATIVE=wait python3 -c "from xkernels.backends import native; m = native.module(wait=True); print('native', native.status())"
timeout $(( 570 - ($(date +%s)-t0) )) python3 -m xkernels.bench --host --rounds 9 > $OUT/host.txt 2>&1
echo "host rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/host.txt
