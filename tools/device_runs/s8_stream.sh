# session 8: the wave model's streaming floor (no kernel estimate below its operand bytes at
# STREAM_FRACTION of the copy bandwidth): selection tests on cuda, held-out GEMMs, the corpus's
# linear GEMMs in bf16
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/ops/test_matmul_config.py tests/ops/test_matmul.py > $OUT/pytest-cuda-matmul.txt 2>&1
echo "pytest rc=$? $(( $(date +%s)-t0 ))s"; tail -1 $OUT/pytest-cuda-matmul.txt
timeout 200 python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; grep -E " 0\.[0-8][0-9]x" $OUT/unseen-gemms.txt; tail -1 $OUT/unseen-gemms.txt
timeout 240 python3 -m xkernels.bench --size models --op linear --dtype bfloat16 --json $OUT/bench-models-linear-bfloat16.json > $OUT/bench-models-linear-bfloat16.txt 2>$OUT/bench-models-linear-bfloat16.err
echo "linear rc=$? $(( $(date +%s)-t0 ))s"
python3 tools/device_runs/bench_summary.py $OUT/bench-models-linear-bfloat16.json --worst 4 --show llama3-8b.up
rm -f $OUT/bench-models-linear-bfloat16.err
