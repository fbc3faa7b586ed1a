. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 120 python3 tools/probes/model_profile_probe.py > $OUT/model-profile-bert.txt 2>&1
echo "profile rc=$? $(( $(date +%s)-t0 ))s"; grep -E "per forward|^patch" $OUT/model-profile-bert.txt
timeout 200 python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/unseen-gemms.txt
timeout 100 python3 -m xkernels.bench --size models --model gpt2 --op matmul --dtype bfloat16 --json $OUT/bench-gpt2-matmul-bf16.json > $OUT/bench-gpt2-matmul-bf16.txt 2>&1
echo "gpt2 matmul rc=$? $(( $(date +%s)-t0 ))s"; grep lm_head $OUT/bench-gpt2-matmul-bf16.txt | cut -c1-160
timeout 140 python3 tools/probes/short_rows_probe.py --json $OUT/short-rows.json > $OUT/short-rows.txt 2>&1
echo "short rows rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/short-rows.txt
