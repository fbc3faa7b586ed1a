# Every test suite on the cuda backend (XKERNELS_TEST_BACKENDS=cuda), in three processes; the logs
# packed into pytest-cuda.tgz, the last line of each printed. What `tox -e cuda` runs, without tox.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
export XKERNELS_TEST_BACKENDS=cuda
# the op suites in two halves: the element-wise and fused ops', then matmul's and the front door's
A=$(find tests/ops/elementwise tests/ops/fused -name 'test_*.py' | sort | tr '\n' ' ')
B=$(find tests/ops -name 'test_*.py' | grep -v "^tests/ops/elementwise/\|^tests/ops/fused/" | sort | tr '\n' ' ')
C=$(ls tests/test_*.py tests/*/test_*.py | grep -v "^tests/ops/\|^tests/npu_compile/" | tr '\n' ' ')
timeout 550 python3 -m pytest -v -p no:cacheprovider -rfE $A > $OUT/pytest-cuda-ops1.txt 2>&1 &
timeout 550 python3 -m pytest -v -p no:cacheprovider -rfE $B > $OUT/pytest-cuda-ops2.txt 2>&1 &
timeout 550 python3 -m pytest -v -p no:cacheprovider -rfE $C > $OUT/pytest-cuda-rest.txt 2>&1 &
wait
unset XKERNELS_TEST_BACKENDS
for f in $OUT/pytest-cuda-*.txt; do echo "== $f"; grep -E "^(FAILED|ERROR)" $f | head -30; tail -1 $f; done
tar czf $OUT/pytest-cuda.tgz -C $OUT $(cd $OUT && ls pytest-cuda-*.txt) && rm $OUT/pytest-cuda-*.txt
