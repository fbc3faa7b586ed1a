# session 9, run 9: BERT-base's and ViT-B/16's linear corpus rows in bf16 on the final code (the
# FFN up + gelu rows among them; the 1025-4096 rule through the table)
. tools/device_runs/common.sh
rm -f $OUT/install.log
export XKERNELS_CACHE_DIR=$(mktemp -d)
timeout 200 python3 -m xkernels.bench --size models --op linear --model bert-base --model vit-b16 --dtype bfloat16 --json $OUT/bench-models-linear-bert-vit-bf16.json > $OUT/bench-models-linear-bert-vit-bf16.txt 2>&1
echo "rc=$?"; python3 tools/device_runs/bench_summary.py $OUT/bench-models-linear-bert-vit-bf16.json --show gelu --worst 3
