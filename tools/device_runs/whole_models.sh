# Whole models, four ways (torch, enable(), patch(), patch+enable) in interleaved rounds:
# `python -m xkernels.bench --model bert-base` (16 x 512) and `--model gpt2` (8 x 1024), bf16.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
for m in bert-base gpt2; do
  timeout 250 python3 -m xkernels.bench --model $m --dtype bfloat16 --json $OUT/bench-$m.json > $OUT/bench-$m.txt 2>&1
  echo "$m rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^$m " $OUT/bench-$m.txt
done
