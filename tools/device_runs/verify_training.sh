# session 6: the cuda suites, the patched BERT training step by GEMM signature, host time per
# call form, and the whole-model bench (bert-base, gpt2)
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
A=$(ls tests/ops/test_*.py | head -5 | tr '\n' ' ')
B=$(ls tests/ops/test_*.py | tail -n +6 | tr '\n' ' ')
C=$(ls tests/test_*.py tests/harness/test_*.py tests/backends/test_*.py | tr '\n' ' ')
export XKERNELS_TEST_BACKENDS=cuda
timeout 240 python3 -m pytest -v -p no:cacheprovider -rfE $A > $OUT/pytest-cuda-ops1.txt 2>&1 &
timeout 240 python3 -m pytest -v -p no:cacheprovider -rfE $B > $OUT/pytest-cuda-ops2.txt 2>&1 &
timeout 240 python3 -m pytest -v -p no:cacheprovider -rfE $C > $OUT/pytest-cuda-rest.txt 2>&1 &
wait
unset XKERNELS_TEST_BACKENDS
for f in $OUT/pytest-cuda-*.txt; do echo "== $f"; grep -E "FAILED|ERROR" $f | grep -v "^FAILED\|^ERROR" | head -30; tail -1 $f; done
echo "tests $(( $(date +%s)-t0 ))s"
timeout 120 python3 tools/probes/train_step_probe.py > $OUT/train-step-bert.txt 2>&1
echo "train step rc=$? $(( $(date +%s)-t0 ))s"; grep -E "per step|signatures|us vs torch|sum over" $OUT/train-step-bert.txt | cut -c1-260
timeout 90 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$? $(( $(date +%s)-t0 ))s"; grep -E " xk " $OUT/forms-host-probe.txt | cut -c1-110
timeout 150 python3 -m xkernels.bench --model bert-base --dtype bfloat16 --json $OUT/bench-bert-base.json > $OUT/bench-bert-base.txt 2>&1
echo "bert rc=$? $(( $(date +%s)-t0 ))s"; tail -8 $OUT/bench-bert-base.txt
timeout 120 python3 -m xkernels.bench --model gpt2 --dtype bfloat16 --json $OUT/bench-gpt2.json > $OUT/bench-gpt2.txt 2>&1
echo "gpt2 rc=$? $(( $(date +%s)-t0 ))s"; tail -8 $OUT/bench-gpt2.txt
