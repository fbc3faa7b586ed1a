# usage: compiled_models.sh [probe|gpt2]
# the compiled gated MLP at decode sizes: its cuda tests (the graph holds the fused kernel, the
# result matches float64), then bench --model llama under torch.compile at 16 and 48 tokens
# (the pointer and TMA rules of gated_linear's sm90 table), torch against patch.
# `probe`: instead, tools/probes/compiled_host.py at 16 and 48 tokens, each way its own compiled
# copy, in the default mode and with CUDA graphs (mode="reduce-overhead").
# `gpt2`: instead, the compiled linear tests on cuda, then bench --model gpt2 under torch.compile
# (its MLP's gelu_tanh in the BLAS's epilogue), torch against patch
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
if [ "${1:-}" = probe ]; then
  timeout 560 python3 tools/probes/compiled_host.py --cases llama:16,llama:48 --mode default --mode reduce-overhead \
    --rounds 15 --json $OUT/compiled-host.json > $OUT/compiled-host.txt 2>&1
  echo "probe rc=$? $(( $(date +%s)-t0 ))s"; grep "seq" $OUT/compiled-host.txt
  exit 0
fi
if [ "${1:-}" = gpt2 ]; then
  XKERNELS_TEST_BACKENDS=cuda timeout 200 python3 -m pytest -q -rs tests/ops/matmul/test_compiled.py > $OUT/tests-cuda.txt 2>&1
  echo "tests rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/tests-cuda.txt
  timeout 300 python3 -m xkernels.bench --model gpt2 --mode compile --way torch,patch --dtype bf16 --rounds 7 \
    --json $OUT/bench-gpt2-compile.json > $OUT/bench-gpt2-compile.txt 2>&1
  echo "gpt2 rc=$? $(( $(date +%s)-t0 ))s"; grep -v "^  " $OUT/bench-gpt2-compile.txt | tail -8
  exit 0
fi
XKERNELS_TEST_BACKENDS=cuda timeout 300 python3 -m pytest -q -rs tests/ops/fused/test_gated_linear_compiled.py \
  tests/ops/matmul/test_compiled.py "tests/test_blocks.py::test_blocks_run_their_own_code_on_a_backend_that_runs_no_kernels" > $OUT/tests-cuda.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/tests-cuda.txt
for seq in 16 48; do
  timeout 200 python3 -m xkernels.bench --model llama --mode compile --way torch,patch --dtype bf16 --batch 1 \
    --seq $seq --rounds 7 --json $OUT/bench-llama-compile-$seq.json > $OUT/bench-llama-compile-$seq.txt 2>&1
  echo "seq $seq rc=$? $(( $(date +%s)-t0 ))s"; grep -v "^  " $OUT/bench-llama-compile-$seq.txt | tail -12
done
