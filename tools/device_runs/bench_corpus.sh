# usage: gpu_bench.sh DTYPE [elementwise|small]...
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
dt=$1; shift
timeout 420 python3 -m xkernels.bench --size models --op matmul,linear --dtype $dt --json $OUT/bench-models-gemm-$dt.json > $OUT/bench-models-gemm-$dt.txt 2>$OUT/bench-models-gemm-$dt.err
echo "gemm $dt rc=$? $(( $(date +%s)-t0 ))s"
for extra in "$@"; do
  if [ $extra = elementwise ]; then
    timeout 200 python3 -m xkernels.bench --size models --op add,broadcast --json $OUT/bench-models-elementwise.json > $OUT/bench-models-elementwise.txt 2>$OUT/bench-models-elementwise.err
  else
    timeout 200 python3 -m xkernels.bench --size small --json $OUT/bench-small.json > $OUT/bench-small.txt 2>$OUT/bench-small.err
  fi
  echo "$extra rc=$? $(( $(date +%s)-t0 ))s"
done
python3 - <<'PY'
import json, statistics, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/bench-*.json")):
    d = json.load(open(f))
    for op in ("matmul", "linear", "add", "broadcast"):
        for dt in ("bfloat16", "float16", "float32"):
            r = [x["speedup"] for x in d["rows"] if x["op"] == op and x["dtype"] == dt and "speedup" in x]
            if r:
                print(os.path.basename(f), op, dt, "n", len(r), "geomean %.3f" % statistics.geometric_mean(r),
                      "worst %.3f" % min(r), "below0.9", sum(v < 0.9 for v in r))
    errs = [x for x in d["rows"] if "error" in x]
    if errs: print("ERRORS", len(errs), errs[:3])
PY
grep -h "form:" $OUT/bench-small.txt 2>/dev/null | head -20
