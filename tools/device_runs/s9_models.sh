# session 9, run 2: BERT-base whole model (patch / enable), then every GEMM of the corpus in fp16
# (matmul and linear; bf16 linear was s8/7) and the BERT/ViT linears in bf16 (the FFN rules)
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 200 python3 -m xkernels.bench --model bert-base --dtype bfloat16 --json $OUT/bench-bert-base.json > $OUT/bench-bert-base.txt 2>&1
echo "bert rc=$? $(( $(date +%s)-t0 ))s"; tail -8 $OUT/bench-bert-base.txt
timeout 330 python3 -m xkernels.bench --size models --op matmul,linear --dtype float16 --json $OUT/bench-models-gemm-float16.json > $OUT/bench-models-gemm-float16.txt 2>&1
echo "gemm fp16 rc=$? $(( $(date +%s)-t0 ))s"
python3 tools/device_runs/bench_summary.py $OUT/bench-models-gemm-float16.json
