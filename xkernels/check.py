"""``python -m xkernels.check``: every op's cases against a float64 PyTorch reference.

    python -m xkernels.check [--device D] [--backend NAME] [--op OP] [--dtype DT] [--quick]
                             [--seed N] [--json PATH]

Prints one row per case (op, dtype, shape, layout, max abs/rel error, tolerance, pass) and a
summary; exits 0 when every case passes, 1 when any fails, 2 when the device is not usable here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence

import torch

from xkernels.harness import TargetUnavailable, resolve_target
from xkernels.harness.accuracy import CheckResult, run_checks
from xkernels.harness.cases import OP_NAMES, cases, parse_dtype

COLUMNS = (("op", 9), ("dtype", 8), ("shape", 24), ("layout", 30), ("max abs err", 11),
           ("max rel err", 11), ("tolerance", 30), ("pass", 4))


def split_list(values: Sequence[str] | None) -> list[str]:
    """``--op a --op b,c`` → ``["a", "b", "c"]``."""
    return [v.strip() for arg in values or () for v in arg.split(",") if v.strip()]


def _row(cells: Sequence[str]) -> str:
    return "  ".join(f"{c:<{w}}" for c, (_, w) in zip(cells, COLUMNS)).rstrip()


def _num(v: float) -> str:
    return "nan" if math.isnan(v) else f"{v:.2e}"


def format_result(r: CheckResult) -> str:
    c = r.case
    line = _row([c.op, str(c.dtype).removeprefix("torch."), c.shape_label, c.layout, _num(r.max_abs),
                 _num(r.max_rel), r.tolerance, "ok" if r.passed else "FAIL"])
    return line if r.passed else f"{line}\n    -> {r.message}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m xkernels.check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", help="torch device type to check on: cuda, npu, cpu (default: best present)")
    p.add_argument("--backend", help="force an xkernels backend, e.g. interpreter, interpreter-npu")
    p.add_argument("--op", action="append", help=f"op(s) to check, repeat or comma-separate: {', '.join(OP_NAMES)}")
    p.add_argument("--dtype", action="append", help="dtype(s): float16, bfloat16, float32, int32, int64")
    p.add_argument("--quick", action="store_true", help="the small CI subset (default: full, incl. seed sizes)")
    p.add_argument("--seed", type=int, help="replay the inputs of an earlier run (default: a fresh seed)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ops = split_list(args.op) or list(OP_NAMES)
        dtypes = [parse_dtype(d) for d in split_list(args.dtype)] or None
        selected = cases(ops, dtypes, ["quick" if args.quick else "full"])
    except ValueError as exc:
        print(f"xkernels.check: {exc}", file=sys.stderr)
        return 2
    try:
        target = resolve_target(args.device, args.backend)
    except TargetUnavailable as exc:
        print(f"xkernels.check: {exc}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    subset = "quick" if args.quick else "full"
    print(f"xkernels.check: {target}, {len(selected)} {subset} cases, seed {seed} (--seed {seed} replays)")
    print(_row([name for name, _ in COLUMNS]))
    start = time.perf_counter()
    results = run_checks(selected, target.backend, target.device, seed,
                         on_result=lambda r: print(format_result(r), flush=True))
    failed = [r for r in results if not r.passed]
    print(f"{len(results)} cases: {len(results) - len(failed)} passed, {len(failed)} failed "
          f"in {time.perf_counter() - start:.1f} s ({target}, seed {seed})")
    if args.json:
        header = {"backend": target.backend.name, "device": str(target.device), "seed": seed, "subset": subset,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__, "host": platform.node()}
        with open(args.json, "w") as f:
            json.dump({"header": header, "results": [r.as_dict() for r in results]}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
