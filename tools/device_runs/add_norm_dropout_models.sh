# The compiled form's dropout (BERT's output blocks in training), after the one-draw-per-four-elements
# change: its cuda tests, tools/probes/norm_backward_compiled.py --dropout 0.1 (the measurement the
# "compiled_dropout" rules of ops/tuning/cuda/add_norm.json come from), then BERT-base's compiled
# training step with hidden dropout 0.1 as a user compiles it (kernel_split --compile --dropout),
# torch and patch.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda XKERNELS_REQUIRE_MODELS=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE \
  tests/ops/fused/test_add_norm_compiled.py > $OUT/tests-cuda-compiled.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^(FAILED|ERROR)" $OUT/tests-cuda-compiled.txt | head; tail -1 $OUT/tests-cuda-compiled.txt
timeout 170 python3 tools/probes/norm_backward_compiled.py --norms layer --dropout 0.1 \
  --shapes 8192x768 12608x768 8192x1024 8192x896 2048x4096 4096x4096 > $OUT/probe-dropout.txt 2>&1
echo "probe rc=$? $(( $(date +%s)-t0 ))s"; grep -i "compiled /\|error" $OUT/probe-dropout.txt | head -14
left=$(( 560-($(date +%s)-t0) ))
timeout $left python3 tools/probes/kernel_split.py --model bert-base --pass step --compile --dropout 0.1 \
  --json $OUT/split-bert-base-step-compiled-dropout.json > $OUT/split-bert-base-step-compiled-dropout.txt 2>&1
echo "split rc=$? $(( $(date +%s)-t0 ))s"; head -12 $OUT/split-bert-base-step-compiled-dropout.txt
