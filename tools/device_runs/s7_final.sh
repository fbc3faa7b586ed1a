# session 7, final code: every cuda suite (tests_cuda.sh: three processes), then host time per call form
. tools/device_runs/tests_cuda.sh
grep -h "epilogue" $OUT/pytest-cuda-*.txt | head -8
unset XKERNELS_TEST_BACKENDS
timeout 60 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$?"; grep -E " xk |^part" $OUT/forms-host-probe.txt | cut -c1-110
