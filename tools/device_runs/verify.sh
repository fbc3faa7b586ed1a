. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 100 python3 tools/probes/model_profile_probe.py > $OUT/model-profile-bert-2.txt 2>&1
echo "profile rc=$? $(( $(date +%s)-t0 ))s"; grep -A40 "^--- patched, host" $OUT/model-profile-bert-2.txt | cut -c1-200
XKERNELS_TEST_BACKENDS=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/ops/test_matmul.py tests/ops/test_library.py tests/harness/test_models.py tests/cli/test_tune.py tests/test_autotune.py > $OUT/pytest-cuda-verify.txt 2>&1
echo "pytest rc=$? $(( $(date +%s)-t0 ))s"; tail -25 $OUT/pytest-cuda-verify.txt | cut -c1-250
timeout 200 python3 -m xkernels.bench --size large --json $OUT/bench-large.json > $OUT/bench-large.txt 2>&1
echo "large rc=$? $(( $(date +%s)-t0 ))s"; cut -c1-150 $OUT/bench-large.txt | tail -20
