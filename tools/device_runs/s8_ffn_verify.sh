# session 8: the corpus's BERT-base and ViT-B/16 linear GEMMs (bf16, fp16) after the FFN rules' change
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 420 python3 -m xkernels.bench --size models --op linear --model bert-base --model vit-b16 --dtype bfloat16,float16 --json $OUT/bench-models-linear-bert-vit.json > $OUT/bench-models-linear-bert-vit.txt 2>$OUT/bench.err
echo "bench rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/bench.err
python3 tools/device_runs/bench_summary.py $OUT/bench-models-linear-bert-vit.json --worst 0 --show ffn_up
rm -f $OUT/bench.err
