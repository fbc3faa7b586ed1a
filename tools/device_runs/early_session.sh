#!/usr/bin/env bash
# One device-tool call on a lent GPU: install, record device/versions, run the op suites on the
# cuda backend, sweep tuning configs, and run check/bench when present. Outputs go to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/xk-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/device.txt"
python3 - <<'PY' | tee "$OUT/cuda-properties.json"
import json, xkernels
b = xkernels.get_backend("cuda")
print(json.dumps({"available": b.is_available(), "reason": b.unavailable_reason(),
                  "properties": b.properties().as_dict()}, indent=1, default=str))
PY
XKERNELS_TEST_BACKENDS=cuda timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -x tests 2>&1 | tail -25 | tee "$OUT/pytest-cuda.txt"
python3 tools/probes/dispatch_probe.py 2>&1 | tee "$OUT/dispatch-fast.txt"
XKERNELS_FAST_LAUNCH=0 python3 tools/probes/dispatch_probe.py 2>&1 | tee "$OUT/dispatch-slow.txt"
[ -n "${SKIP_TUNE:-}" ] || timeout ${TUNE_TIMEOUT:-240} python3 -m xkernels.tune --backend cuda --out-dir "$OUT/tune" 2>&1 | tail -40 | tee "$OUT/tune.txt"
[ -d "$OUT/tune" ] && tar czf "$OUT/tune.tgz" -C "$OUT" tune && rm -rf "$OUT/tune"
rm -f "$OUT/session.log.unused"
