# the patched BERT training step by GEMM signature, and forced configs of the fused FFN up + gelu
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 240 python3 tools/probes/train_step_probe.py > $OUT/train-step-bert.txt 2>&1
echo "train step rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/train-step-bert.txt
# timeout 240 python3 tools/probes/ffn_gelu_probe.py > $OUT/ffn-gelu.txt 2>&1
# (ffn probe: run 1 of this session)
