# session 9, run 6: after the TMA launch record and the wall-time choice: the held-out GEMMs (with
# wall per call up to 77 tokens), BERT-base and GPT-2 whole models
. tools/device_runs/common.sh
rm -f $OUT/install.log
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 170 python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; tail -1 $OUT/unseen-gemms.txt; grep -E "wall/call" $OUT/unseen-gemms.txt | grep -v "vendor BLAS"; awk '$5+0 < 0.95 && $5 ~ /x$/' $OUT/unseen-gemms.txt
timeout 200 python3 -m xkernels.bench --model bert-base --dtype bfloat16 --json $OUT/bench-bert-base.json > $OUT/bench-bert-base.txt 2>&1
echo "bert rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^bert-base" $OUT/bench-bert-base.txt
timeout 150 python3 -m xkernels.bench --model gpt2 --dtype bfloat16 --json $OUT/bench-gpt2.json > $OUT/bench-gpt2.txt 2>&1
echo "gpt2 rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^gpt2" $OUT/bench-gpt2.txt
