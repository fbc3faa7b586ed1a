# session 8: the selection tests on cuda after the streaming-floor test's fix (its no-figures
# backend must have no figures on a GPU machine too)
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
XKERNELS_TEST_BACKENDS=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/ops/test_matmul_config.py tests/test_training.py tests/test_enable.py > $OUT/pytest-cuda-config.txt 2>&1
echo "pytest rc=$?"; tail -3 $OUT/pytest-cuda-config.txt
