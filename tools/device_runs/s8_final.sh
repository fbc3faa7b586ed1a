# session 8, final code: every cuda suite (three processes), the call-form host probe (with
# enable()'s routed forms), the corpus's linear GEMMs in bf16, the held-out GEMMs, GPT-2 whole
. tools/device_runs/tests_cuda.sh
unset XKERNELS_TEST_BACKENDS
t0=$(date +%s)
timeout 90 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$? $(( $(date +%s)-t0 ))s"; grep -E " xk |^part" $OUT/forms-host-probe.txt | cut -c1-100
timeout 240 python3 -m xkernels.bench --size models --op linear --dtype bfloat16 --json $OUT/bench-models-linear-bfloat16.json > $OUT/bench-models-linear-bfloat16.txt 2>$OUT/bench-models-linear-bfloat16.err
echo "linear rc=$? $(( $(date +%s)-t0 ))s"
python3 tools/device_runs/bench_summary.py $OUT/bench-models-linear-bfloat16.json
timeout 150 python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/unseen-gemms.txt
timeout 150 python3 -m xkernels.bench --model gpt2 --dtype bfloat16 --json $OUT/bench-gpt2.json > $OUT/bench-gpt2.txt 2>&1
echo "gpt2 rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^gpt2 " $OUT/bench-gpt2.txt
