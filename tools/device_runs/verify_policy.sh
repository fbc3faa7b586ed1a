# session 6, after the vendor-cost policy: the cuda suites, held-out GEMMs, the patched BERT
# training step and the whole-model bench; outputs packed in one archive (the device tool
# returns a limited number of files)
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
R=$OUT/r; mkdir -p $R; cp $OUT/device.txt $R/
t0=$(date +%s)
A=$(ls tests/ops/test_*.py | head -5 | tr '\n' ' ')
B=$(ls tests/ops/test_*.py | tail -n +6 | tr '\n' ' ')
C=$(ls tests/test_*.py tests/harness/test_*.py tests/backends/test_*.py | tr '\n' ' ')
export XKERNELS_TEST_BACKENDS=cuda
timeout 240 python3 -m pytest -v -p no:cacheprovider -rfE $A > $R/pytest-cuda-ops1.txt 2>&1 &
timeout 240 python3 -m pytest -v -p no:cacheprovider -rfE $B > $R/pytest-cuda-ops2.txt 2>&1 &
timeout 240 python3 -m pytest -v -p no:cacheprovider -rfE $C > $R/pytest-cuda-rest.txt 2>&1 &
wait
unset XKERNELS_TEST_BACKENDS
for f in $R/pytest-cuda-*.txt; do echo "== $f"; grep -E "FAILED|ERROR" $f | grep -v "^FAILED\|^ERROR" | head -30; tail -1 $f; done
echo "tests $(( $(date +%s)-t0 ))s"
timeout 200 python3 tools/probes/unseen_gemms.py --json $R/unseen-gemms.json > $R/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; tail -4 $R/unseen-gemms.txt
timeout 100 python3 tools/probes/train_step_probe.py > $R/train-step-bert.txt 2>&1
echo "train step rc=$? $(( $(date +%s)-t0 ))s"; grep -E "per step|signatures|us vs torch|sum over" $R/train-step-bert.txt | cut -c1-200
for m in bert-base gpt2; do
  timeout 120 python3 -m xkernels.bench --model $m --dtype bfloat16 --json $R/bench-$m.json > $R/bench-$m.txt 2>&1
  echo "$m rc=$? $(( $(date +%s)-t0 ))s"; grep -E "torch|patch" $R/bench-$m.txt | grep -v "^xkernels"
done
tar -C $OUT -czf $OUT/verify-policy.tgz r && rm -rf $R
