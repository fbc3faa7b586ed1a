# usage: compiled_decoder_masks.sh [cudagraph]
# decoders' causal masks under torch.compile and CUDA graphs as a user runs them (transformers'
# masks as it builds them while tracing or capturing, bench --masks traced): the mask-decision
# tests and the eager add + norm suites on cuda, then bench --model llama and gpt2 under
# torch.compile, torch against patch.
# `cudagraph`: instead, the same benches with CUDA graphs, then kernel_split.py of the Llama
# stack's compiled training step.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
bench() {  # bench MODE MODEL SECONDS
  timeout $3 python3 -m xkernels.bench --model $2 --mode $1 --masks traced --way torch,patch --dtype bf16 \
    --rounds 5 --json $OUT/bench-$2-$1-masks-traced.json > $OUT/bench-$2-$1-masks-traced.txt 2>&1
  echo "$1 $2 rc=$? $(( $(date +%s)-t0 ))s"; grep -v "^  " $OUT/bench-$2-$1-masks-traced.txt | tail -6
}
if [ "${1:-}" = cudagraph ]; then
  bench cudagraph llama 150
  bench cudagraph gpt2 150
  timeout 200 python3 tools/probes/kernel_split.py --model llama --pass step --compile \
    --json $OUT/split-llama-step-compiled.json > $OUT/split-llama-step-compiled.txt 2>&1
  echo "split rc=$? $(( $(date +%s)-t0 ))s"; grep -v "Warn\|warn" $OUT/split-llama-step-compiled.txt | sed -n 1,12p
  exit 0
fi
XKERNELS_TEST_BACKENDS=cuda timeout 150 python3 -m pytest -q -rs tests/test_mask_decisions.py \
  tests/ops/fused/test_add_norm.py tests/ops/fused/test_add_norm_compiled.py > $OUT/tests-cuda.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/tests-cuda.txt
bench compile llama 200
bench compile gpt2 220
