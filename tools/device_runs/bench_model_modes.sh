# usage: bench_model_modes.sh [MODEL ...]   (default: llama vit bert-base gpt2; one or two per device call)
# the model-mode tests on cuda (CUDA-graph replay against eager, the builder), then per model
# bench --model in bf16 in the three modes (eager, cudagraph, compile), four ways each
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 240 python3 -m pytest -q -rs tests/harness/test_model_runs.py \
  tests/harness/test_model_zoo.py > $OUT/tests-model-runs.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/tests-model-runs.txt
for m in ${@:-llama vit bert-base gpt2}; do
  timeout 540 python3 -m xkernels.bench --model $m --mode eager,cudagraph,compile --dtype bf16 \
    --json $OUT/bench-$m-modes.json --csv $OUT/bench-$m-modes.csv > $OUT/bench-$m-modes.txt 2>&1
  echo "$m rc=$? $(( $(date +%s)-t0 ))s"; grep -v "^  " $OUT/bench-$m-modes.txt | tail -28
done
