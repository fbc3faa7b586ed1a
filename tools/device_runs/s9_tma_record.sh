# session 9, run 5: TMA launch records (tensor maps encoded per call in direct_launch.c) and the
# wave model's wall-time choice: every cuda suite, the TMA host probe, the call-form probe
. tools/device_runs/tests_cuda.sh
unset XKERNELS_TEST_BACKENDS
tar czf $OUT/pytest-cuda.tgz -C $OUT $(cd $OUT && ls pytest-cuda-*.txt) && rm $OUT/pytest-cuda-*.txt
timeout 120 python3 tools/probes/tma_launch_probe.py > $OUT/tma-host-probe.txt 2>&1
echo "tma rc=$?"; grep -E "^M=|hot entry|wall/call" $OUT/tma-host-probe.txt
timeout 120 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$?"; grep -E " xk |^part" $OUT/forms-host-probe.txt | cut -c1-100
