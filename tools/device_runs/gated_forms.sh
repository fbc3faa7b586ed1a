# The gated MLP forms read from any forward (xkernels/gated_forms.py) and T5's RMSNorm on cuda:
# their tests, then whole models from committed configs (random weights, bf16, torch and patch in
# 5 interleaved rounds, forward and training). Models (default all): flan-t5 (T5 v1.1's gated-gelu
# MLP and T5's RMSNorm), gte (dropout between the product and the down-projection; transformers
# 5.23: carry its wheel in .whl/), seed-oss (Seed-OSS-36B's width, 2 layers: dropout after it),
# modernbert (one projection chunked in two).
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_gated_forms.py \
  tests/test_blocks.py tests/test_patch_families.py \
  -k "gated or t5 or blocks or decoder or llama or umt5 or gte or seed or modernbert or phi3 or glm" \
  > $OUT/pytest-cuda-gated.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^(FAILED|ERROR|SKIPPED)" $OUT/pytest-cuda-gated.txt | head; tail -1 $OUT/pytest-cuda-gated.txt
run() {  # name, config, batch, seq
  timeout 200 python3 -m xkernels.bench --model-config tools/probes/data/$2.json --way torch,patch --dtype bfloat16 \
    --batch $3 --seq $4 --json $OUT/bench-$1.json > $OUT/bench-$1.txt 2>&1
  echo "$1 rc=$? $(( $(date +%s)-t0 ))s"; tail -6 $OUT/bench-$1.txt
}
for m in ${@:-flan-t5 gte seed-oss modernbert}; do
  case $m in
    flan-t5) run flan-t5-base flan-t5-base 8 512 ;;
    gte) run gte-base gte-multilingual-base 16 512 ;;
    seed-oss) run seed-oss-2-layers seed-oss-36b-2-layers 1 2048 ;;
    modernbert) run modernbert-base modernbert-base 16 512 ;;
    *) echo "unknown model $m"; exit 2 ;;
  esac
done
