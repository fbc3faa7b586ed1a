# The compiled training form of residual add + norm (ops/fused/add_norm_compiled.py):
# tools/probes/norm_backward_compiled.py per norm and shape (the measurement the sm90 rules of
# ops/tuning/cuda/add_norm.json are written from), its cuda tests and the compiled patched models'
# tests, then bench --mode compile for bert-base (and llama when time is left), torch and patch.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 170 python3 tools/probes/norm_backward_compiled.py --norms layer rms \
  --shapes 8192x768 12608x768 8192x1024 4096x4096 2048x4096 8192x896 > $OUT/probe.txt 2>&1
echo "probe rc=$? $(( $(date +%s)-t0 ))s"; grep -i "ratio\|error" $OUT/probe.txt | head -14
XKERNELS_TEST_BACKENDS=cuda XKERNELS_REQUIRE_MODELS=1 timeout 170 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/ops/fused/test_add_norm_compiled.py tests/test_blocks.py -k "compiled or launches" > $OUT/tests-cuda.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; tail -4 $OUT/tests-cuda.txt
timeout 180 python3 -m xkernels.bench --model bert-base --mode compile --way torch,patch --dtype bf16 --rounds 3 \
  --json $OUT/bench-bert-base-compile.json > $OUT/bench-bert-base-compile.txt 2>&1
echo "bert-base rc=$? $(( $(date +%s)-t0 ))s"; grep -v "^  " $OUT/bench-bert-base-compile.txt | tail -14
if [ $(( $(date +%s)-t0 )) -lt 400 ]; then
  timeout $(( 540-($(date +%s)-t0) )) python3 -m xkernels.bench --model llama --mode compile --way torch,patch --dtype bf16 --rounds 3 \
    --json $OUT/bench-llama-compile.json > $OUT/bench-llama-compile.txt 2>&1
  echo "llama rc=$? $(( $(date +%s)-t0 ))s"; grep -v "^  " $OUT/bench-llama-compile.txt | tail -12
fi
