# session 8: the launch-bound exception at 15 us (HOST_BOUND_MS): held-out GEMMs again, the
# matmul selection tests on cuda
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/ops/test_matmul_config.py > $OUT/pytest-cuda-config.txt 2>&1
echo "pytest rc=$? $(( $(date +%s)-t0 ))s"; tail -1 $OUT/pytest-cuda-config.txt
timeout 200 python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; grep -E " 0\.[0-8][0-9]x" $OUT/unseen-gemms.txt; tail -1 $OUT/unseen-gemms.txt
