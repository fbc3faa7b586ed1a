"""Does the vendor-cost policy generalise? Offline, on the committed calibration measurements
(results/h100-2026-11-22-s4-run*: every candidate config and torch timed per shape, H100 bf16).

For each measured (N, K) in turn, the candidates' costs and the BLAS cost are fitted on the
*other* (N, K) only (as for a layer nobody measured); each of its shapes then takes the wave
model's best kernel (old policy) or, with the policy, the BLAS unless that kernel is estimated
``advantage`` x faster than the fitted BLAS. The ratio to torch uses the measured times of the
chosen config on that shape (the BLAS counts as 1.0: torch itself, front door aside).

    python tools/probes/vendor_policy_offline.py [ADVANTAGE ...]
"""

import json
import math
import statistics
import sys

from xkernels.cli import matmul_tables as mt
from xkernels.ops.matmul import config as mc

RUNS = ["results/h100-2026-11-22-s4-run1/calib.jsonl", "results/h100-2026-11-22-s4-run2/calib2.jsonl",
        "results/h100-2026-11-22-s4-run2/outliers-remeasured.rows.jsonl"]


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main():
    advantages = [float(a) for a in sys.argv[1:]] or [1.0, 1.1]
    rows = [json.loads(line) for f in RUNS for line in open(f) if line.strip()]
    rows = [r for r in rows if "cfgs" in r]
    for op in ("linear", "matmul"):
        merged = mt.merge(rows, op)
        cands = mt.candidates(merged, mt.HALF, 132)[0]["configs"]
        blas = next(c for c in cands if c.get("VENDOR"))["cost"]
        fit = [r["torch_ms"] / mc.vendor_ms(blas, mc.Shape(r["M"], r["N"], r["K"], 1, 2, True), bool(r["act"]))
               for r in merged]
        print(f"{op}: BLAS cost {blas}; measured/fitted min {min(fit):.2f} median {statistics.median(fit):.2f} "
              f"max {max(fit):.2f}")
        fits = {}
        for group in sorted({(r["N"], r["K"]) for r in merged}):  # fitted once per held-out (N, K)
            fits[group] = mt.candidates([r for r in merged if (r["N"], r["K"]) != group], mt.HALF, 132)[0]["configs"]
        for adv in advantages:
            old, new = [], []
            for group, cc in fits.items():
                vendor = next(c for c in cc if c.get("VENDOR"))["cost"]
                kernels = [c for c in cc if not c.get("VENDOR")]
                for r in (r for r in merged if (r["N"], r["K"]) == group):
                    s = mc.Shape(r["M"], r["N"], r["K"], 1, 2, True)
                    measured = {mt._key(c["cfg"]): c["ms"] for c in r["cfgs"] if "ms" in c}
                    est = min((mc.fitted_ms(c["cost"], cfg, s, 132), mt._key(cfg))
                              for c in kernels for cfg in [{k: v for k, v in c.items() if k != "cost"}])
                    if est[1] not in measured:
                        continue
                    old.append(r["torch_ms"] / measured[est[1]])
                    # the policy as it stands: wall estimates (device or the route's host cost)
                    wall = max(est[0], mc.HOST_MS["pointer"])
                    to_blas = wall * adv > max(mc.vendor_ms(vendor, s, bool(r["act"])), mc.HOST_MS["vendor"])
                    new.append(1.0 if to_blas else old[-1])
            print(f"  advantage {adv:g}: {len(old)} shapes of held-out (N, K); wave model alone: geomean "
                  f"{geomean(old):.3f}, worst {min(old):.2f}, {sum(x < 0.9 for x in old)} below 0.9 | with the BLAS "
                  f"policy: geomean {geomean(new):.3f}, worst {min(new):.2f}, {sum(x < 0.9 for x in new)} below 0.9, "
                  f"{sum(x == 1.0 for x in new)} to the BLAS")


if __name__ == "__main__":
    main()
