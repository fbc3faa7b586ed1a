# The experts' routing passes (ops/fused/experts_routing.py, xkernels/experts_forward.py) on cuda:
# their suites and the experts' (pytest, -v), then patch() on MoE families at their published widths
# (family_speed.sh decoders: Mixtral-8x7B, Qwen3-30B-A3B, GPT-OSS-20B; 2 layers, 1 x 2048 tokens,
# bf16, 3 interleaved rounds), then the kernel split of Mixtral's and Qwen3-MoE's training step.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
XKERNELS_TEST_BACKENDS=cuda timeout 150 python3 -m pytest -v -p no:cacheprovider -rfE tests/ops/fused/test_experts_routing.py \
  tests/test_experts_forward.py tests/test_experts_gate.py > $OUT/pytest-cuda-routing.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/pytest-cuda-routing.txt | head -20; tail -1 $OUT/pytest-cuda-routing.txt
NAMES="${NAMES:-mixtral-8x7b qwen3-30b-a3b gpt-oss-20b}" SECONDS_LEFT=240 bash tools/device_runs/family_speed.sh decoders
F=tools/probes/data/families
mkdir -p $OUT/kernel-split
for m in ${SPLIT:-mixtral-8x7b qwen3-30b-a3b}; do for p in ${PASSES:-step}; do
  timeout 90 python3 tools/probes/kernel_split.py --model-config $F/$m.json --pass $p --top 24 \
    --json $OUT/kernel-split/kernel-split-$m-$p.json > $OUT/kernel-split/kernel-split-$m-$p.txt 2>&1
  head -12 $OUT/kernel-split/kernel-split-$m-$p.txt | cut -c1-200
done; done
