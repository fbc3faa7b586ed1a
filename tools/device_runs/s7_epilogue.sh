# session 7: linear's bias + relu / gelu_tanh in cuBLASLt's epilogue (vendor_epilogues), GPT-2's
# FFN in the corpus as gelu_tanh: changed cuda tests, the corpus's linear GEMMs (bf16), GPT-2 whole
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/ops/test_matmul.py tests/ops/test_autograd.py tests/ops/test_op.py tests/ops/test_library.py tests/test_training.py > $OUT/pytest-cuda-changed.txt 2>&1
echo "pytest rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/pytest-cuda-changed.txt
timeout 330 python3 -m xkernels.bench --size models --op linear --dtype bfloat16 --json $OUT/bench-models-linear-bfloat16.json > $OUT/bench-models-linear-bfloat16.txt 2>$OUT/bench-models-linear-bfloat16.err
echo "linear rc=$? $(( $(date +%s)-t0 ))s"
python3 tools/device_runs/bench_summary.py $OUT/bench-models-linear-bfloat16.json --show "3072x768, 3072"
timeout 150 python3 -m xkernels.bench --model gpt2 --dtype bfloat16 --json $OUT/bench-gpt2.json > $OUT/bench-gpt2.txt 2>&1
echo "gpt2 rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^gpt2 " $OUT/bench-gpt2.txt
