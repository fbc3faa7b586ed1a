#!/usr/bin/env bash
# One device-tool call on a lent GPU, running the named steps in order; outputs go to $OUT.
#   bash tools/device_runs/early_steps.sh dispatch ops linear tune bench-mm bench-ew suite check
# Each step's output lands in $OUT/<step>.txt (plus JSON where the tool writes one).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/xk-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)";
  echo "steps: $*"; } | tee "$OUT/device.txt"
for step in "$@"; do
  echo "=== $step $(date -u +%T)"
  case $step in
    dispatch) PROFILE=1 python3 tools/probes/dispatch_probe.py 2>&1 | tee "$OUT/dispatch.txt"
              XKERNELS_DIRECT_LAUNCH=0 python3 tools/probes/dispatch_probe.py 2>&1 | tee "$OUT/dispatch-triton-c-launch.txt"
              XKERNELS_FAST_LAUNCH=0 python3 tools/probes/dispatch_probe.py 2>&1 | tee "$OUT/dispatch-no-fast-launch.txt" ;;
    ops) XKERNELS_TEST_BACKENDS=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/ops 2>&1 | tail -15 | tee "$OUT/pytest-ops.txt" ;;
    suite) XKERNELS_TEST_BACKENDS=cuda timeout 400 python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tail -15 | tee "$OUT/pytest-cuda.txt" ;;
    linear) timeout 200 python3 tools/probes/linear_probe.py --configs 2>&1 | tee "$OUT/linear-probe.txt" ;;
    tune) timeout ${TUNE_TIMEOUT:-420} python3 -m xkernels.tune --backend cuda --op ${TUNE_OPS:-matmul,linear} \
            --out-dir "$OUT/tune" --install ops/tuning/cuda 2>&1 | tee "$OUT/tune.txt"
          cp ops/tuning/cuda/*.json "$OUT/tune/" 2>/dev/null; tar czf "$OUT/tune.tgz" -C "$OUT" tune && rm -rf "$OUT/tune" ;;
    bench-mm) timeout 300 python3 -m xkernels.bench --device cuda --op matmul,linear --size medium \
                --json "$OUT/bench-mm.json" 2>&1 | tee "$OUT/bench-mm.txt" ;;
    bench-all) timeout 500 python3 -m xkernels.bench --device cuda --op ${BENCH_OPS:-broadcast,add,matmul,linear} \
                 --dtype bfloat16,float32 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt" ;;
    check) timeout 300 python3 -m xkernels.check --device cuda --quick 2>&1 | tail -8 | tee "$OUT/check-quick.txt" ;;
    *) echo "unknown step $step" ;;
  esac
done
