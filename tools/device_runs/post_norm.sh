# The add + norm sites read from any forward (xkernels/add_norm_forms.py) and the checkpointing kept
# around fused layer forwards, on cuda: their tests, then BART-base (6 + 6 post-norm layers) and
# DistilBERT-base (6) from committed configs, bf16, torch and patch in 5 interleaved rounds.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_add_norm_forms.py \
  tests/test_gated_forms.py tests/test_training.py tests/test_patch_families.py tests/test_patch.py \
  -k "not generation" > $OUT/pytest-cuda-post-norm.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^(FAILED|ERROR)" $OUT/pytest-cuda-post-norm.txt | head; tail -1 $OUT/pytest-cuda-post-norm.txt
for m in bart-base:8:512 distilbert-base:16:512; do
  IFS=: read name b s <<< "$m"
  timeout 150 python3 -m xkernels.bench --model-config tools/probes/data/$name.json --way torch,patch --dtype bfloat16 \
    --batch $b --seq $s --json $OUT/bench-$name.json > $OUT/bench-$name.txt 2>&1
  echo "$name rc=$? $(( $(date +%s)-t0 ))s"; tail -5 $OUT/bench-$name.txt
done
