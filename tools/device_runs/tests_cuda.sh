. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
export XKERNELS_TEST_BACKENDS=cuda
A=$(ls tests/ops/test_*.py | head -5 | tr '\n' ' ')
B=$(ls tests/ops/test_*.py | tail -n +6 | tr '\n' ' ')
C=$(ls tests/test_*.py tests/cli/test_*.py tests/harness/test_*.py tests/backends/test_*.py | tr '\n' ' ')
timeout 550 python3 -m pytest -v -p no:cacheprovider -rfE $A > $OUT/pytest-cuda-ops1.txt 2>&1 &
timeout 550 python3 -m pytest -v -p no:cacheprovider -rfE $B > $OUT/pytest-cuda-ops2.txt 2>&1 &
timeout 550 python3 -m pytest -v -p no:cacheprovider -rfE $C > $OUT/pytest-cuda-rest.txt 2>&1 &
wait
for f in $OUT/pytest-cuda-*.txt; do echo "== $f"; grep -E "FAILED|ERROR" $f | grep -v "^FAILED\|^ERROR" | head -30; tail -1 $f; done
