# Held-out shapes (xkernels/harness/heldout.json: model families outside the corpus at odd token
# counts): bench --size heldout for one dtype and op per call, each loss re-measured in interleaved
# rounds (columns confirmed, spread), then the summary: geomean and worst ratio after confirmation,
# the rows still below 1.0x, and how many first-use checks ran and what they chose.
#   tools/device_runs/heldout.sh [DTYPE=bfloat16] [OP=linear] [check|nocheck]
# Four calls cover the set: bfloat16/float16 x linear/matmul (linear ~205 cases, matmul ~54).
# nocheck: XKERNELS_FIRST_USE_CHECK=0 (no evidence -> the BLAS), for comparison.
. tools/device_runs/common.sh
DT=${1:-bfloat16}; OP=${2:-linear}; MODE=${3:-check}
export XKERNELS_CACHE_DIR=$(mktemp -d)  # no verdicts from an earlier run: every new bucket is checked here
[ "$MODE" = nocheck ] && export XKERNELS_FIRST_USE_CHECK=0
name=heldout-$OP-$DT-$MODE
t0=$(date +%s)
timeout 540 python3 -m xkernels.bench --size heldout --op $OP --dtype $DT --json $OUT/$name.json > $OUT/$name.txt 2>&1
echo "bench rc=$? $(( $(date +%s)-t0 ))s"
tail -3 $OUT/$name.txt
cp -r $XKERNELS_CACHE_DIR/tuning $OUT/$name-cache 2>/dev/null
python3 - $OUT/$name.json $XKERNELS_CACHE_DIR <<'PY' | tee $OUT/$name-summary.txt
import json, pathlib, sys
d = json.load(open(sys.argv[1]))
s = d.get("summary", {})
print(f"{d['header']['device_name']}: {s.get('rows')} rows, geomean {s.get('geomean', 0):.3f}x, worst after "
      f"confirmation {s.get('worst', 0):.2f}x ({s.get('worst_case')}); below 1.0x: {s.get('below_1_single_pass')} "
      f"in one pass, {s.get('below_1_confirmed')} confirmed")
for r in d["rows"]:
    if "error" in r:
        print(f"  ERROR {r['op']} {r['shape']} {r['layout']}: {r['error']}")
    elif r.get("confirmed") is not None and r["confirmed"] < 1.0:
        print(f"  {r['confirmed']:.2f}x ({r['spread'][0]:.2f}-{r['spread'][1]:.2f}) {r['op']} {r['shape']} "
              f"{r['layout']}: {r['route']}; {r.get('explain')}")
routes = {}
for r in d["rows"]:
    if "route" in r:
        why = (r.get("explain") or "")
        kind = ("measured rule" if why.startswith("a measured rule") else "first-use" if why.startswith("first-use")
                else "neighbours" if why.startswith("neighbours") else "no evidence" if why.startswith("no evidence")
                else why[:40])
        routes.setdefault((r["route"], kind), []).append(r.get("confirmed") or r["speedup"])
for (route, kind), v in sorted(routes.items()):
    print(f"  {route:14s} {kind:16s} {len(v):4d} rows, min {min(v):.2f}x")
for f in pathlib.Path(sys.argv[2]).glob("tuning/*/first_use/*.json"):
    vs = json.loads(f.read_text())["verdicts"].values()
    print(f"  first-use checks ({f.name}): {len(vs)}, kernel won {sum(v['winner'] == 'kernel' for v in vs)}")
PY
