# session 6, the shipped code: the whole-model bench (sequential, patch in place) twice per model,
# and host time per call form
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 60 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$? $(( $(date +%s)-t0 ))s"; grep -E " xk " $OUT/forms-host-probe.txt | cut -c1-110
for m in bert-base gpt2; do for i in 1 2; do
  timeout 120 python3 -m xkernels.bench --model $m --dtype bfloat16 --json $OUT/bench-$m-$i.json > $OUT/bench-$m-$i.txt 2>&1
  echo "$m run $i rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^(bert|gpt2)" $OUT/bench-$m-$i.txt
done; done
