# session 6: the models-corpus GEMMs (bf16) after the vendor-cost policy, host time per call form,
# and the TMA hot-entry test fixed after verify_policy.sh
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE tests/ops/test_matmul.py -k "tma or vendor or m_major" > $OUT/pytest-cuda-tma.txt 2>&1
echo "pytest rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/pytest-cuda-tma.txt
timeout 80 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$? $(( $(date +%s)-t0 ))s"; grep -E " xk " $OUT/forms-host-probe.txt | cut -c1-110
timeout 400 python3 -m xkernels.bench --size models --op matmul,linear --dtype bfloat16 --json $OUT/bench-models-gemm-bfloat16.json > $OUT/bench-models-gemm-bfloat16.txt 2>$OUT/bench-models-gemm-bfloat16.err
echo "gemm rc=$? $(( $(date +%s)-t0 ))s"
python3 - <<'PY'
import json, statistics, os
d = json.load(open(os.environ["OUT"] + "/bench-models-gemm-bfloat16.json"))
for op in ("matmul", "linear"):
    r = [x for x in d["rows"] if x["op"] == op and "speedup" in x]
    s = [x["speedup"] for x in r]
    print(op, "n", len(s), "geomean %.3f" % statistics.geometric_mean(s), "worst %.3f" % min(s), "below0.9", sum(v < 0.9 for v in s))
    for x in sorted(r, key=lambda x: x["speedup"])[:5]:
        print("   ", round(x["speedup"], 3), x["shape"], x["layout"], x.get("route"))
errs = [x for x in d["rows"] if "error" in x]
if errs: print("ERRORS", len(errs), errs[:3])
PY
