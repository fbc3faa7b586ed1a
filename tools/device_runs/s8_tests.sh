# session 8: every cuda suite again (after the training test's count fix) and the held-out GEMMs,
# the pytest logs packed in one archive (the device tool returns few files)
. tools/device_runs/tests_cuda.sh
unset XKERNELS_TEST_BACKENDS
t0=$(date +%s)
timeout 200 python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; grep -E " 0\.[0-8][0-9]x" $OUT/unseen-gemms.txt; tail -1 $OUT/unseen-gemms.txt
tar czf $OUT/pytest-cuda.tgz -C $OUT pytest-cuda-ops1.txt pytest-cuda-ops2.txt pytest-cuda-rest.txt && rm $OUT/pytest-cuda-*.txt
