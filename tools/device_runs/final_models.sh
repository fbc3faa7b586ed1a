# session 6, last run: changed tests on cuda, host time per call form, held-out GEMMs (with the
# launch-bound exception of the vendor policy), and the whole-model bench in interleaved rounds
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/ops/test_matmul.py tests/ops/test_matmul_config.py tests/ops/test_autograd.py tests/ops/test_op.py > $OUT/pytest-cuda-changed.txt 2>&1
echo "pytest rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/pytest-cuda-changed.txt
timeout 80 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$? $(( $(date +%s)-t0 ))s"; grep -E " xk " $OUT/forms-host-probe.txt | cut -c1-110
timeout 150 python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; tail -1 $OUT/unseen-gemms.txt
for m in bert-base gpt2; do
  timeout 150 python3 -m xkernels.bench --model $m --dtype bfloat16 --json $OUT/bench-$m.json > $OUT/bench-$m.txt 2>&1
  echo "$m rc=$? $(( $(date +%s)-t0 ))s"; grep -E "torch|patch|enable" $OUT/bench-$m.txt | grep -v "^xkernels"
done
