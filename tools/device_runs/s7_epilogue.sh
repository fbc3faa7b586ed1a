# session 7: linear's bias + relu / gelu_tanh in cuBLASLt's epilogue (vendor_epilogues), GPT-2's
# FFN in the corpus as gelu_tanh: changed cuda tests, the corpus's linear GEMMs (bf16), GPT-2 whole
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/ops/test_matmul.py tests/ops/test_autograd.py tests/ops/test_op.py tests/ops/test_library.py tests/test_training.py > $OUT/pytest-cuda-changed.txt 2>&1
echo "pytest rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/pytest-cuda-changed.txt
timeout 330 python3 -m xkernels.bench --size models --op linear --dtype bfloat16 --json $OUT/bench-models-linear-bfloat16.json > $OUT/bench-models-linear-bfloat16.txt 2>$OUT/bench-models-linear-bfloat16.err
echo "linear rc=$? $(( $(date +%s)-t0 ))s"
python3 - <<'PY'
import json, statistics, os
d = json.load(open(os.environ["OUT"] + "/bench-models-linear-bfloat16.json"))
r = [x for x in d["rows"] if x["op"] == "linear" and "speedup" in x]
s = [x["speedup"] for x in r]
print("linear n", len(s), "geomean %.3f" % statistics.geometric_mean(s), "worst %.3f" % min(s), "below0.9", sum(v < 0.9 for v in s))
for x in sorted(r, key=lambda x: x["speedup"])[:5]:
    print("   ", round(x["speedup"], 3), x["shape"], x["layout"], x.get("route"))
for x in r:
    if "3072x768" in x["shape"] and ("8192x" in x["shape"] or "12608x" in x["shape"]) and "gelu" in x["layout"]:
        print("  FFN", round(x["speedup"], 3), x["shape"], x["layout"], x.get("route"), x.get("variant"))
errs = [x for x in d["rows"] if "error" in x]
if errs: print("ERRORS", len(errs), errs[:3])
PY
timeout 150 python3 -m xkernels.bench --model gpt2 --dtype bfloat16 --json $OUT/bench-gpt2.json > $OUT/bench-gpt2.txt 2>&1
echo "gpt2 rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^gpt2 " $OUT/bench-gpt2.txt
