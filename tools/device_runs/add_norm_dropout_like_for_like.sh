# BERT-base's compiled training step with hidden dropout 0.1, torch and patch, with transformers'
# attention masks decided as in eager mode for both ways (kernel_split --masks eager: what
# bench --mode compile compares), then the same at dropout 0 for the form without dropout.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
for d in 0.1 0.0; do
  left=$(( 520-($(date +%s)-t0) )); [ $left -lt 120 ] && { echo "dropout $d: no time left"; continue; }
  timeout $left python3 tools/probes/kernel_split.py --model bert-base --pass step --compile --dropout $d --masks eager \
    --steps 10 --json $OUT/split-bert-base-step-compiled-eager-masks-dropout-$d.json \
    > $OUT/split-bert-base-step-compiled-eager-masks-dropout-$d.txt 2>&1
  echo "dropout $d rc=$? $(( $(date +%s)-t0 ))s"; grep -v Warn $OUT/split-bert-base-step-compiled-eager-masks-dropout-$d.txt | grep -v "^  warn\|_warn_once" | head -24
done
