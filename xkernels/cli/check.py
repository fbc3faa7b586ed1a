"""``python -m xkernels.check``: every op's cases against a float64 PyTorch reference.

    python -m xkernels.check [--device D] [--backend NAME] [--op OP] [--dtype DT] [--quick]
                             [--seed N] [--json PATH] [--max-memory SIZE]

Prints one row per case (op, dtype, shape, layout, max abs/rel error, tolerance, pass) and a
summary. A case whose estimated peak memory does not fit what the device and the host have free
is skipped, and its row says how much it needs. Exit codes: 0 every case ran and passed; 1 a
case failed; 3 none failed but some were skipped for memory; 2 the device is not usable here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time
from collections.abc import Sequence

import torch

from xkernels.harness import TargetUnavailable, memory, resolve_target
from xkernels.harness.accuracy import CheckResult, run_checks
from xkernels.harness.cases import OP_NAMES, cases, parse_dtype

EXIT_SKIPPED = 3  # no case failed, but some were not run (not enough free memory)
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
    if r.skipped:
        return _row([c.op, str(c.dtype).removeprefix("torch."), c.shape_label, c.layout, "-", "-", "-",
                     "skip"]) + f"\n    -> {r.message}"
    line = _row([c.op, str(c.dtype).removeprefix("torch."), c.shape_label, c.layout, _num(r.max_abs),
                 _num(r.max_rel), r.tolerance, "ok" if r.passed else "FAIL"])
    return line if r.passed else f"{line}\n    -> {r.message}"


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"1.5GiB"``, ``"1000000"`` → bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise ValueError(f"--max-memory {text!r}: expected a size such as 512M, 2G or 1.5GiB")
    return int(float(m[1]) * _UNITS[m[2].upper()])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m xkernels.check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", help="torch device type to check on: cuda, npu, cpu (default: best present)")
    p.add_argument("--backend", help="force an xkernels backend, e.g. interpreter, interpreter-npu")
    p.add_argument("--op", action="append", help=f"op(s) to check, repeat or comma-separate: {', '.join(OP_NAMES)}")
    p.add_argument("--dtype", action="append", help="dtype(s): float16, bfloat16, float32, int32, int64")
    p.add_argument("--quick", action="store_true", help="the small CI subset (default: full, incl. seed sizes)")
    p.add_argument("--seed", type=int, help="replay the inputs of an earlier run (default: a fresh seed)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    # "%%" below: argparse %-formats help strings
    p.add_argument("--max-memory", metavar="SIZE",
                   help="skip cases estimated to need more than SIZE (e.g. 8G) on the device or the host "
                        f"(default: {memory.MARGIN:.0%}% of what each has free, read before every case)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ops = split_list(args.op) or list(OP_NAMES)
        dtypes = [parse_dtype(d) for d in split_list(args.dtype)] or None
        selected = cases(ops, dtypes, ["quick" if args.quick else "full"])
        max_memory = parse_size(args.max_memory) if args.max_memory is not None else None
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
    free = memory.free_memory(target.device)
    cap = f"--max-memory {memory.gib(max_memory)} per pool and " if max_memory is not None else ""
    print(f"xkernels.check: {target}, {len(selected)} {subset} cases, seed {seed} (--seed {seed} replays)")
    print(f"  memory: {free}; a case runs if its estimated peak fits {cap}{memory.MARGIN:.0%} of that")
    print(_row([name for name, _ in COLUMNS]))
    start = time.perf_counter()
    results = run_checks(selected, target.backend, target.device, seed,
                         on_result=lambda r: print(format_result(r), flush=True), max_memory=max_memory)
    skipped = [r for r in results if r.skipped]
    failed = [r for r in results if not r.passed and not r.skipped]
    why = " (not enough free memory: see the rows marked skip)" if skipped else ""
    print(f"{len(results)} cases: {len(results) - len(failed) - len(skipped)} passed, {len(failed)} failed, "
          f"{len(skipped)} skipped{why} in {time.perf_counter() - start:.1f} s ({target}, seed {seed})")
    if args.json:
        header = {"backend": target.backend.name, "device": str(target.device), "seed": seed, "subset": subset,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__, "host": platform.node(),
                  "memory": {"device_free_bytes": free.device, "host_free_bytes": free.host, "source": free.source,
                             "margin": memory.MARGIN, "max_memory_bytes": max_memory},
                  "summary": {"cases": len(results), "passed": len(results) - len(failed) - len(skipped),
                              "failed": len(failed), "skipped": len(skipped)}}
        with open(args.json, "w") as f:
            json.dump({"header": header, "results": [r.as_dict() for r in results]}, f, indent=1)
    return 1 if failed else EXIT_SKIPPED if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
