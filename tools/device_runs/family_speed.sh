# patch() on model families at their published widths (tools/probes/data/families/, random weights):
# is the patched model ever slower than torch's? One group per call: `decoders` (1 x 2048 tokens,
# 2 layers), `encoders` (16 x 512 tokens, 4 layers; BART and T5 also 512 decoder tokens) or `vision`
# (32 images of 224 x 224, 4 layers; wav2vec2 8 one-second clips). bf16, torch / patch in ROUNDS
# (default 3) interleaved rounds, in MODE (default eager; compile, cudagraph); NAMES (file names
# without .json) narrows the group; SHAPE (e.g. "--batch 1 --seq 16") replaces the group's shape and
# TAG names the output files' variant; every model of the group in one process (`--model-config`
# repeated), rows printed as they come.
. tools/device_runs/common.sh
group=${1:-decoders}
F=tools/probes/data/families
case $group in
  decoders) names="mistral-7b qwen2.5-7b qwen3-8b gemma-2-9b phi-3-mini olmo-2-7b mixtral-8x7b qwen3-30b-a3b gpt-oss-20b falcon-7b pythia-1.4b opt-1.3b gpt-j-6b stablelm-3b starcoder2-3b bloom-560m minitron-8b persimmon-8b"; shape="" ;;
  encoders) names="roberta-base electra-base deberta-v3-base distilbert-base modernbert-base albert-base-v2 t5-v1_1-base t5-base bart-base"; shape="--batch 16 --seq 512" ;;
  vision) names="dinov2-base beit-base clip-vit-base-patch16 siglip-base-patch16 swin-base convnext-base wav2vec2-base"; shape="" ;;
  *) echo "family_speed.sh: decoders, encoders or vision, got $group"; exit 2 ;;
esac
names=${NAMES:-$names}
shape=${SHAPE:-$shape}
mode=${MODE:-eager}
configs=$(for n in $names; do printf '%s,' "$F/$n.json"; done)
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout ${SECONDS_LEFT:-560} python3 -m xkernels.bench --model-config "${configs%,}" $shape --way torch,patch \
  --dtype bfloat16 --mode $mode --rounds ${ROUNDS:-3} --json $OUT/family-speed-$group-$mode${TAG:+-$TAG}.json \
  > $OUT/family-speed-$group-$mode${TAG:+-$TAG}.txt 2>&1
echo "$group $mode rc=$? $(( $(date +%s)-t0 ))s"
grep -vE "^  (replaced|fused|kept)" $OUT/family-speed-$group-$mode${TAG:+-$TAG}.txt | cut -c1-260
