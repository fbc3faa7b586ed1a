# session 7: host time per call form after the front door's rework (fewer Python layers, keys of
# positional calls, the backend's allocator), and the whole-model bench in interleaved rounds
# (patch applied and undone each round) with device time beside time
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 90 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$? $(( $(date +%s)-t0 ))s"; grep -E " xk |^part" $OUT/forms-host-probe.txt | cut -c1-110
for m in bert-base gpt2; do
  timeout 200 python3 -m xkernels.bench --model $m --dtype bfloat16 --json $OUT/bench-$m.json > $OUT/bench-$m.txt 2>&1
  echo "$m rc=$? $(( $(date +%s)-t0 ))s"; grep -E "torch|patch|enable|Error|error" $OUT/bench-$m.txt | grep -v "^xkernels\|replaced\|left "
done
