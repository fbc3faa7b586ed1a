"""Replay the matmul/linear evidence gate's launch-bound margin over committed bench results.

For every row of ``python -m xkernels.bench --json`` files that ran the Triton kernel on the
strength of a measured rule or a first-use verdict (its ``explain``), decide as
``ops/matmul/evidence.py`` decides now, and as it decided without the launch-bound margin
(``LAUNCH_BOUND_MARGIN``): a rule is looked up in the shipped cuda tables on an sm90 part
(``--units`` compute units) and put through ``evidence.gate``; a verdict is re-judged from the
times its ``explain`` gives. Prints the rows the margin sends to the BLAS with their bench ratio
(``confirmed`` where the bench re-measured the row, else ``speedup``), the counts (rows now below
0.95x / 1.0x / above 1.05x among them), the worst ratio left on the kernel, and how far the
launch-bound evidence was from the bench's ratio (the margin that spread asks for).

    python tools/evidence_replay.py                      # the H100 corpus and held-out runs
    python tools/evidence_replay.py BENCH.json --margin 1.05
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["results/2026-11-24-h100-gemm-corpus-bf16/*.json", "results/2026-11-24-h100-heldout-*/*.json"]
ACTIVATIONS = ("gelu_tanh", "gelu", "silu", "relu", "leaky_relu")
VERDICT = re.compile(r"kernel ([\d.]+) us vs BLAS ([\d.]+) us, ([\d.]+)x")


def call_of(row: dict[str, Any]) -> tuple[dict[str, Any], tuple[int, int, int, int]]:
    """(bucket fields, (M, N, K, batch)) of a bench row's ``shape`` and ``layout``."""
    found = re.search(r" \+ (\w+)", row["layout"])
    act = found.group(1) if found and found.group(1) in ACTIVATIONS else "none"
    if row["op"] == "linear":
        parts = [p.strip() for p in row["shape"].split(",")]
        x, w = ([int(v) for v in p.split("x")] for p in parts[:2])
        m = 1
        for v in x[:-1]:
            m *= v
        return {"activation": act, "bias": len(parts) > 2}, (m, w[0], w[1], 1)
    a, b = ([int(v) for v in p.strip().split("x")] for p in row["shape"].split("@"))
    return {"activation": act, "bias": False}, (a[-2], b[-1], a[-1], a[0] if len(a) == 3 else 1)


def final(row: dict[str, Any]) -> float:
    return row["confirmed"] if row.get("confirmed") is not None else row["speedup"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help=f"bench JSON files (default: {', '.join(DEFAULT)})")
    p.add_argument("--margin", type=float, default=None, help="the launch-bound margin to replay "
                   "(default: evidence.LAUNCH_BOUND_MARGIN)")
    p.add_argument("--units", type=int, default=132, help="compute units of the sm90 part (132: H100 SXM)")
    args = p.parse_args(argv)
    os.environ["XKERNELS_CACHE_DIR"] = tempfile.mkdtemp()  # the shipped tables only, no verdicts

    import torch

    from xkernels.backends.cuda import CudaBackend
    from xkernels.ops.matmul import config as mc
    from xkernels.ops.matmul import evidence as ev

    class Sm90(CudaBackend):
        def arch(self, device=None) -> str:
            return "sm90"

        def compute_units(self, device=None) -> int:
            return args.units

    backend, cpu = Sm90(), torch.device("cpu")
    margin = ev.LAUNCH_BOUND_MARGIN if args.margin is None else args.margin
    files = args.files or sorted(f for g in DEFAULT for f in glob.glob(str(ROOT / g)))

    def decide(row: dict[str, Any], with_margin: bool) -> tuple[bool, float, float] | None:
        """(kernel runs, evidence ratio, evidence BLAS ms), or None where the row's kernel came
        from neither a measured rule nor a verdict."""
        ev.LAUNCH_BOUND_MARGIN = margin if with_margin else 0.0
        why = row.get("explain") or ""
        if why.startswith("first-use check"):
            found = VERDICT.search(why)
            ratio, blas = float(found.group(3)), float(found.group(2)) * 1e-3
            return ratio >= ev.device_floor(blas, backend, ev.DEVICE_FLOOR), ratio, blas
        if not why.startswith("a measured rule"):
            return None
        fields, (m, n, k, batch) = call_of(row)
        shape = mc.Shape(m, n, k, batch, 2, batch == 1)
        key = mc.bucket_key(getattr(torch, row["dtype"]), shape, fields["activation"], fields["bias"])
        tma = "kmajor" if "TMA" in (row.get("variant") or "") else None
        sel = mc.select(row["op"], backend, cpu, key, shape, tma)
        got = ev.gate(row["op"], backend, cpu, key, shape, tma, sel, "ieee")
        return not got.config.get("VENDOR"), ev.rule_ratio(sel.record) or 0.0, ev.rule_blas_ms(sel.record)

    def counts(c: dict[str, int]) -> str:
        return (f"{c['rows']} rows, {c['kernel']} on the kernel, {c['before']} of them on a rule or verdict the gate "
                f"kept without the margin; the margin sends {c['sent']} to the BLAS: {c['below_0.95']} were below "
                f"0.95x, {c['below_1.0']} below 1.0x, {c['wins_lost']} above 1.05x (wins lost)")

    zero = {"rows": 0, "kernel": 0, "before": 0, "sent": 0, "below_0.95": 0, "below_1.0": 0, "wins_lost": 0}
    totals = dict(zero)
    kept: list[tuple[float, str]] = []
    spread: list[tuple[float, str]] = []
    for f in files:
        rows = json.loads(Path(f).read_text())["rows"]
        name = str(Path(f).resolve().relative_to(ROOT)) if Path(f).resolve().is_relative_to(ROOT) else f
        print(f"== {name}")
        mine = dict(zero)
        for row in rows:
            mine["rows"] += 1
            if row.get("route") != "triton kernel" or row.get("op") not in ("linear", "matmul"):
                continue
            mine["kernel"] += 1
            before, after = decide(row, False), decide(row, True)
            if before is None or not before[0]:
                continue  # no such evidence, or the BLAS already before the margin (rule floor, fill, device floor)
            mine["before"] += 1
            ratio, blas = before[1], before[2]
            label = f"{row['op']} {row['dtype']} {row['shape']} ({row['layout'][:40]})"
            if ev.launch_bound(blas, backend) is not None and ratio > 0:
                spread.append((final(row) / ratio, label))
            if after[0]:
                kept.append((final(row), label))
                continue
            mine["sent"] += 1
            fin = final(row)
            mine["below_0.95"] += fin < 0.95
            mine["below_1.0"] += fin < 1.0
            mine["wins_lost"] += fin > 1.05
            print(f"  -> BLAS: {label}: evidence {ratio:.3f}x at BLAS {blas * 1e3:.1f} us; bench {fin:.3f}x")
        print(f"   {counts(mine)}")
        for k, v in mine.items():
            totals[k] += v
    ev.LAUNCH_BOUND_MARGIN = margin
    print(f"\nmargin {margin:g}x, all files: {counts(totals)}")
    if kept:
        worst_kept, label = min(kept)
        print(f"kernel rows kept: {len(kept)}, worst bench ratio {worst_kept:.3f}x ({label}), below 0.95x: "
              f"{sum(v < 0.95 for v, _ in kept)}")
    if spread:
        worst, label = min(spread)
        print(f"launch-bound evidence ({len(spread)} rows): bench / evidence ratio down to {worst:.3f} ({label}); "
              f"a kernel kept at >= 0.95x the BLAS after such a drift needs {0.95 / worst:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
