"""Summarise a `python -m xkernels.bench --json` file: per op and dtype the case count, geomean
and worst speedup and the count below 0.9x, the slowest cases, and rows whose layout names a
given substring.

    python tools/bench_summary.py BENCH.json [--worst N] [--show SUBSTRING ...]
"""

import argparse
import json
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--worst", type=int, default=5, help="slowest cases listed per op and dtype")
    ap.add_argument("--show", action="append", default=[], help="also list rows whose layout contains this")
    a = ap.parse_args()
    rows = json.load(open(a.json))["rows"]
    timed = [x for x in rows if "speedup" in x]
    for op in sorted({x["op"] for x in timed}):
        for dt in sorted({x["dtype"] for x in timed if x["op"] == op}):
            r = [x for x in timed if x["op"] == op and x["dtype"] == dt]
            s = [x["speedup"] for x in r]
            print(f"{op} {dt} n {len(s)} geomean {statistics.geometric_mean(s):.3f} worst {min(s):.3f} "
                  f"below0.9 {sum(v < 0.9 for v in s)}")
            for x in sorted(r, key=lambda x: x["speedup"])[:a.worst]:
                print("   ", round(x["speedup"], 3), x["shape"], x["layout"], x.get("route"))
            for x in r:
                if any(t in x["layout"] for t in a.show):
                    print("  ", round(x["speedup"], 3), x["shape"], x["layout"], x.get("route"))
    errs = [x for x in rows if "error" in x]
    if errs:
        print("ERRORS", len(errs), errs[:3])


if __name__ == "__main__":
    main()
