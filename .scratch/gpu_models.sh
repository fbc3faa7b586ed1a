. .scratch/gpu_common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
python3 -m xkernels.bench --model bert-base --dtype bfloat16 --json $OUT/bench-bert-base.json > $OUT/bench-bert-base.txt 2>&1
echo "bert rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/bench-bert-base.txt | tail -12
python3 -m xkernels.bench --model gpt2 --dtype bfloat16 --json $OUT/bench-gpt2.json > $OUT/bench-gpt2.txt 2>&1
echo "gpt2 rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/bench-gpt2.txt | tail -12
python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/unseen-gemms.txt
for s in medium large; do python3 -m xkernels.bench --size $s --json $OUT/bench-$s.json > $OUT/bench-$s.txt 2>&1; echo "$s rc=$? $(( $(date +%s)-t0 ))s"; done
