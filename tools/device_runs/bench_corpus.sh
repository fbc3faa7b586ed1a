# The real-model shape corpus and the seed sizes through `python -m xkernels.bench`, one bench JSON
# per item, then its summary (tools/bench_summary.py). Items, run in order:
#   gemm:DTYPE      every corpus GEMM (matmul and linear)  -> bench-models-gemm-DTYPE.json
#   matmul:DTYPE    the corpus's matmuls                   -> bench-models-matmul-DTYPE.json
#   linear:DTYPE    the corpus's linear layers             -> bench-models-linear-DTYPE.json
#   bert-vit:DTYPE  BERT-base's and ViT-B/16's linear rows -> bench-models-linear-bert-vit-DTYPE.json
#   elementwise     the element-wise corpus (add, broadcast; fp16, bf16, fp32)
#   small           the seed sizes (--size small, with the host column per call form)
# e.g. bash tools/device_runs/bench_corpus.sh matmul:bfloat16 elementwise   (one device call: <= 10 min)
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
for item in "$@"; do
  what=${item%%:*}; dt=${item#*:}
  case $what in
    gemm)        name=bench-models-gemm-$dt;   args="--size models --op matmul,linear --dtype $dt" ;;
    matmul)      name=bench-models-matmul-$dt; args="--size models --op matmul --dtype $dt" ;;
    linear)      name=bench-models-linear-$dt; args="--size models --op linear --dtype $dt" ;;
    bert-vit)    name=bench-models-linear-bert-vit-$dt; args="--size models --op linear --model bert-base --model vit-b16 --dtype $dt" ;;
    elementwise) name=bench-models-elementwise; args="--size models --op add,broadcast" ;;
    small)       name=bench-small;             args="--size small" ;;
    *) echo "unknown item $item"; exit 2 ;;
  esac
  timeout 500 python3 -m xkernels.bench --device cuda $args --json $OUT/$name.json > $OUT/$name.txt 2>&1
  echo "$item rc=$? $(( $(date +%s)-t0 ))s"
  python3 tools/bench_summary.py $OUT/$name.json --worst 3
done
