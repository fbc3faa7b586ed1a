# session 9, run 1: every cuda suite (three processes, logs packed) on session 9's front door and
# streaming-floor changes, the call-form host probe (with the allocator/key parts), held-out GEMMs
. tools/device_runs/tests_cuda.sh
unset XKERNELS_TEST_BACKENDS
tar czf $OUT/pytest-cuda.tgz -C $OUT $(cd $OUT && ls pytest-cuda-*.txt) && rm $OUT/pytest-cuda-*.txt
t0=$(date +%s)
timeout 120 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$? $(( $(date +%s)-t0 ))s"; grep -E " xk |^part" $OUT/forms-host-probe.txt | cut -c1-100
timeout 200 python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/unseen-gemms.txt; grep -E "opt|gemma" $OUT/unseen-gemms.txt | grep -E " M=(1|77) "
