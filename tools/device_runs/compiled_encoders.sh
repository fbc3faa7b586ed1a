# usage: compiled_encoders.sh [CONFIG.json ...]
# Encoders under torch.compile, where transformers (torch < 2.14) gives SDPA an all-true mask
# broadcast along the keys: the SDPA kernels per mask layout (tools/probes/attention_mask_layout.py),
# compiled BERT-base's training-step kernels by group, torch and patched (tools/probes/kernel_split.py),
# then bench --mode compile, torch and patch, for bert-base and each config given.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
python3 tools/probes/attention_mask_layout.py 2>&1 | grep -v -i warn > $OUT/attention-mask-layout.txt
echo "layouts $(( $(date +%s)-t0 ))s"; cat $OUT/attention-mask-layout.txt | cut -c1-150
timeout 200 python3 tools/probes/kernel_split.py --model bert-base --pass step --compile --top 12 \
  --json $OUT/split-bert-base-step-compiled.json 2>&1 | grep -v -i warn > $OUT/split-bert-base-step-compiled.txt
echo "split $(( $(date +%s)-t0 ))s"; cat $OUT/split-bert-base-step-compiled.txt | cut -c1-160
timeout 200 python3 -m xkernels.bench --model bert-base --mode compile --way torch,patch --dtype bf16 \
  --json $OUT/bench-bert-base-compile.json > $OUT/bench-bert-base-compile.txt 2>&1
echo "bert-base rc=$? $(( $(date +%s)-t0 ))s"; grep -v "^  " $OUT/bench-bert-base-compile.txt | tail -16
for c in "$@"; do
  n=$(basename $c .json)
  timeout 150 python3 -m xkernels.bench --model-config $c --mode compile --way torch,patch --dtype bf16 \
    --json $OUT/bench-$n-compile.json > $OUT/bench-$n-compile.txt 2>&1
  echo "$n rc=$? $(( $(date +%s)-t0 ))s"; grep -v "^  " $OUT/bench-$n-compile.txt | tail -12
done
