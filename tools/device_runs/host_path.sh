# The host path against torch's: `python -m xkernels.bench --host` (every call form, the device
# held busy) with the native extension and with XKERNELS_NATIVE=0, then whole models eager
# (`bench --model all`, torch / enable / patch, bf16, interleaved rounds). ARGS: the models
# (default all).
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_NATIVE=wait python3 -c "from xkernels.backends import native; m = native.module(wait=True); print('native', native.status())"
timeout 120 python3 -m xkernels.bench --host --rounds 9 > $OUT/host-native-on.txt 2>&1
echo "host native on rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/host-native-on.txt
XKERNELS_NATIVE=0 timeout 120 python3 -m xkernels.bench --host --rounds 9 > $OUT/host-native-off.txt 2>&1
echo "host native off rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/host-native-off.txt
models=${1:-all}
timeout $(( 560 - ($(date +%s)-t0) )) python3 -m xkernels.bench --model $models --mode eager --way torch,enable,patch \
  --dtype bfloat16 --json $OUT/bench-models-eager.json > $OUT/bench-models-eager.txt 2>&1
echo "models rc=$? $(( $(date +%s)-t0 ))s"; tail -30 $OUT/bench-models-eager.txt
