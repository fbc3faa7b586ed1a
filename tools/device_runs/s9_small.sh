# session 9, run 8: the seed sizes after the floor's tie-break, and the selection tests on cuda
. tools/device_runs/common.sh
rm -f $OUT/install.log
export XKERNELS_CACHE_DIR=$(mktemp -d)
XKERNELS_TEST_BACKENDS=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/ops/test_matmul_config.py > $OUT/pytest-cuda-config.txt 2>&1
tail -1 $OUT/pytest-cuda-config.txt
timeout 200 python3 -m xkernels.bench --size small --json $OUT/bench-small.json > $OUT/bench-small.txt 2>&1
echo "small rc=$?"; python3 tools/device_runs/bench_summary.py $OUT/bench-small.json --worst 2
