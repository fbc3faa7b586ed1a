# Mixed-precision training of patched models: fp32 parameters under bf16 torch.autocast, where
# patch()'s add + norm steps fuse on the fp32 residual stream and gated MLPs cast their GEMM
# operands (xkernels/block_steps.py same_math). The changed suites on cuda, then
# tools/probes/autocast_probe.py on the built-in models (torch and patch, interleaved rounds of
# training steps). ARGS: the models (default bert-base,gpt2,llama,vit).
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_blocks.py \
  tests/ops/test_autocast.py > $OUT/pytest-cuda-autocast.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^(FAILED|ERROR)" $OUT/pytest-cuda-autocast.txt | head; tail -1 $OUT/pytest-cuda-autocast.txt
timeout $(( 570 - ($(date +%s)-t0) )) python3 tools/probes/autocast_probe.py --models ${1:-bert-base,gpt2,llama,vit} \
  --rounds 7 --steps 4 --json $OUT/autocast-models.json > $OUT/autocast-models.txt 2>&1
echo "probe rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/autocast-models.txt
