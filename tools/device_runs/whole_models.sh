. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 150 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$? $(( $(date +%s)-t0 ))s"
timeout 200 python3 -m xkernels.bench --model bert-base --dtype bfloat16 --json $OUT/bench-bert-base.json > $OUT/bench-bert-base.txt 2>&1
echo "bert rc=$? $(( $(date +%s)-t0 ))s"; tail -8 $OUT/bench-bert-base.txt
timeout 150 python3 -m xkernels.bench --model gpt2 --dtype bfloat16 --json $OUT/bench-gpt2.json > $OUT/bench-gpt2.txt 2>&1
echo "gpt2 rc=$? $(( $(date +%s)-t0 ))s"; tail -8 $OUT/bench-gpt2.txt
