"""Offline Ascend NPU compile check: Triton frontend + on-chip memory planning, no CANN, no device.

For every case that :func:`xkernels.cli.compile_check.collect` lists (one op, dtype, tuning
entry, epilogue, layout and SoC each), this runs the compile chain of
:mod:`xkernels.cli.npu_chain` (triton-ascend down to ``.ttadapter``, then bishengir-compile's
UB / L0C / L1 memory planning) in forked worker processes. Identical compilations run once, and
SoCs of one memory class (:func:`xkernels.backends.npu.memory_class`) share one compilation
(:func:`compilation_key`); then it prints a table and a summary.

Outcomes: ``ok`` (plan passed, stopped at the CANN binary step), ``ub-overflow``,
``cc-overflow``, ``frontend-error`` (triton-ascend rejected the kernel, or no .ttadapter),
``plan-error`` (anything else bishengir-compile reported, including an L1/cbuf overflow).
What this cannot tell: whether the binary builds (hivmc), whether the kernel runs or is correct,
or how fast it is.

Usage::

    python -m xkernels.npu_compile [--soc SOC ...] [--op OP ...] [--quick] [--keep DIR] [--jobs N]

Exit status: 0 when every case is ``ok``, 1 when any is not, 2 when triton-ascend,
bishengir-compile or the case list is missing (one line says what to install).

triton-ascend installs as the top-level ``triton`` package, so it needs its own virtual
environment (see docs/npu-offline-compile.md); this module imports it only when it runs cases.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# the compile chain of one case; its public names are importable from here too
from xkernels.cli.npu_chain import (
    BISHENGIR_FLAGS,
    BISHENGIR_FLAGS_A5,
    FRONTEND_OPTIONS_A5,
    HIVMC_A5_STUB,
    INSTALL_HINT,
    PLAN_TIMEOUT_S,
    RESULTS,
    Result,
    _a5_compiler,
    _unwrap_kernel,
    check_environment,
    classify_plan,
    compile_ttadapter,
    find_bishengir,
    plan_memory,
    run_case,
    toolchain,
    triton_ascend_problem,
)

__all__ = ["BISHENGIR_FLAGS", "BISHENGIR_FLAGS_A5", "FRONTEND_OPTIONS_A5", "HIVMC_A5_STUB", "INSTALL_HINT",
           "PLAN_TIMEOUT_S", "RESULTS", "Result", "build_parser", "check_environment", "classify_plan",
           "compilation_key", "compile_ttadapter", "find_bishengir", "format_table", "main", "plan_memory",
           "quick_subset", "run_case", "run_cases", "summary", "toolchain", "triton_ascend_problem"]


# The cases, for the forked workers: kernels (JITFunction objects) are not sent by pickle.
_WORK: dict[str, Any] = {}


def _work(index: int) -> tuple[int, Result]:
    return index, run_case(_WORK["cases"][index], _WORK["bishengir"], _WORK["keep"])


def compilation_key(case: Any, per_soc: bool = False) -> tuple:
    """What the compilers see for ``case``: the kernel, its signature, constants and the SoC's
    memory class (its toolchain and every size and alignment of its target description, not its
    core counts; ``per_soc``: the SoC itself). Two cases with one key are one compilation: the
    same input and flags, and targets whose plans were found identical (see
    docs/npu-offline-compile.md)."""
    from xkernels.backends.npu import memory_class

    kernel = _unwrap_kernel(case.kernel)
    return (id(kernel), tuple(sorted(case.signature.items())),
            tuple(sorted((k, repr(v)) for k, v in case.constants.items())),
            case.soc if per_soc else memory_class(case.soc))


def run_cases(cases: Sequence[Any], jobs: int = 0, *, keep: str | os.PathLike | None = None,
              bishengir: str | None = None, progress: Any = None, dedupe: bool = True,
              per_soc: bool = False) -> list[Result]:
    """Check ``cases`` (CompileCase-like objects) with ``jobs`` worker processes; results in order.

    ``jobs`` of 0 means one per CPU. The work always runs in forked worker processes, so the
    caller's process never holds an MLIR context (forking after a failed compile is unsafe).
    With ``dedupe``, cases with one :func:`compilation_key` are compiled once (``per_soc``: once
    per SoC, not per memory class); the others get its result with ``same_as`` naming it and
    zero seconds. ``progress``, if given, is called with
    each Result as it completes. Raises RuntimeError when triton-ascend or bishengir-compile is
    missing.
    """
    cases = list(cases)
    if not cases:
        return []
    if bishengir is None:
        bishengir, problem = check_environment()
        if problem:
            raise RuntimeError(problem)
    first: dict[tuple, int] = {}
    copies: dict[int, list[int]] = {}
    for i, c in enumerate(cases):
        j = first.setdefault(compilation_key(c, per_soc), i) if dedupe else i
        copies.setdefault(j, []).append(i)
    unique = list(copies)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(unique)))
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
    _WORK.update(cases=cases, bishengir=bishengir, keep=str(keep) if keep else None)
    results: list[Result | None] = [None] * len(cases)
    ctx = multiprocessing.get_context("fork")
    try:
        with ctx.Pool(jobs) as pool:
            for index, res in pool.imap_unordered(_work, unique, chunksize=1):
                for i in copies[index]:
                    c = cases[i]
                    results[i] = res if i == index else dataclasses.replace(
                        res, op=c.op, dtype=c.dtype, config=c.config, soc=c.soc, seconds=0.0, frontend_s=0.0, plan_s=0.0,
                        same_as=f"{res.op} {res.dtype} {res.config} {res.soc}")
                    if progress is not None:
                        progress(results[i])
    finally:
        _WORK.clear()
    return [r for r in results if r is not None]


def quick_subset(cases: Iterable[Any]) -> list[Any]:
    """The first case of each (op, dtype, soc): a smoke run of every kernel variant."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for c in cases:
        key = (c.op, c.dtype, c.soc)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _grouped(results: Sequence[Result]) -> list[tuple[Result, list[str]]]:
    """Results that differ only in the SoC, as (first result, its SoCs), in first-seen order."""
    groups: dict[tuple, tuple[Result, list[str]]] = {}
    for r in results:
        groups.setdefault((r.op, r.dtype, r.config, r.result, r.detail), (r, []))[1].append(r.soc)
    return list(groups.values())


def format_table(results: Sequence[Result], by_soc: bool = True) -> str:
    """A plain-text table: op, dtype, config, SoC, result, seconds, detail. With ``by_soc`` False,
    cases that differ only in the SoC are one row ("Ascend910B1 +11": the first SoC and how many
    more), its seconds the sum of their compilations."""
    head = ("op", "dtype", "config", "SoC", "result", "seconds", "detail")
    if by_soc:
        rows = [(r.op, r.dtype, r.config, r.soc, r.result, f"{r.seconds:.2f}", r.detail) for r in results]
    else:
        secs: dict[tuple, float] = {}
        for r in results:
            key = (r.op, r.dtype, r.config, r.result, r.detail)
            secs[key] = secs.get(key, 0.0) + r.seconds
        rows = [(r.op, r.dtype, r.config, socs[0] + (f" +{len(socs) - 1}" if len(socs) > 1 else ""), r.result,
                 f"{secs[(r.op, r.dtype, r.config, r.result, r.detail)]:.2f}", r.detail)
                for r, socs in _grouped(results)]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    widths[-1] = 0  # the detail column is not padded

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(head), line(["-" * w if w else "------" for w in widths])]
    out += [line(row) for row in rows]
    return "\n".join(out)


def summary(results: Sequence[Result], wall_s: float) -> str:
    counts = {k: sum(r.result == k for r in results) for k in RESULTS}
    parts = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    compiled = [r for r in results if not r.same_as]
    cpu = sum(r.seconds for r in compiled)
    mean = cpu / len(compiled) if compiled else 0.0
    return (f"{len(results)} cases ({len(compiled)} distinct compilations): {parts or 'none'}; "
            f"{wall_s:.1f} s wall, {cpu:.1f} s summed, {mean:.2f} s per compilation")


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    out = [v.strip() for item in values for v in item.split(",") if v.strip()]
    return out or None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m xkernels.npu_compile",
        description="Offline Ascend NPU compile check: triton-ascend frontend to .ttadapter, then "
                    "bishengir-compile's memory planning (UB / L0C / L1), without CANN or a device. "
                    "Exits 1 if any case is not ok, 2 if a tool is missing.",
    )
    p.add_argument("--soc", action="append", metavar="SOC",
                   help="SoC to check, e.g. Ascend910B3 (repeat or comma-separate; "
                        "default: every SoC of backends/npu_socs.json: Atlas A2, A3 and Ascend 950 / A5)")
    p.add_argument("--op", action="append", metavar="OP",
                   help="op to check (repeat or comma-separate; default: all)")
    p.add_argument("--quick", action="store_true",
                   help="only the first tuning entry of each (op, dtype, SoC)")
    p.add_argument("--keep", metavar="DIR",
                   help="keep each case's .ttir/.ttadapter and compiler logs under DIR")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="worker processes (default: one per CPU)")
    p.add_argument("--per-soc", action="store_true",
                   help="compile every SoC, not one SoC per memory class (the SoCs of a class differ "
                        "only in core counts and get the same plan)")
    p.add_argument("--by-soc", action="store_true",
                   help="one table row and progress line per SoC (default: SoCs that share a result "
                        "are one row, and only compilations get a progress line)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bishengir, problem = check_environment()
    if problem:
        print(f"xkernels.npu_compile: {problem}", file=sys.stderr)
        return 2
    try:
        from xkernels.cli.compile_check import collect
    except ImportError as exc:
        print(f"xkernels.npu_compile: cannot import the case list xkernels.cli.compile_check ({exc}); "
              "install xkernels into this environment (pip install -e .)", file=sys.stderr)
        return 2
    try:
        cases, notes = collect(_split(args.soc), _split(args.op))
    except ValueError as exc:
        print(f"xkernels.npu_compile: {exc}", file=sys.stderr)
        return 1
    if args.quick:
        cases = quick_subset(cases)
    if not cases:
        print("xkernels.npu_compile: no cases selected", file=sys.stderr)
        return 1
    a5 = any(toolchain(c.soc) == "a5" for c in cases)
    if a5 and _a5_compiler(bishengir) is None:
        print("xkernels.npu_compile: bishengir-compile-a5 not found (the A5 SoCs need it): "
              "pip install ascendnpu-ir==1.2.0", file=sys.stderr)
        return 2
    jobs = args.jobs or os.cpu_count() or 1
    print(f"checking {len(cases)} cases with {min(jobs, len(cases))} jobs (bishengir-compile: {bishengir}"
          f"{'; A5: ' + str(_a5_compiler(bishengir)) if a5 else ''})", flush=True)
    done = [0, 0]

    def progress(r: Result) -> None:
        done[0] += 1
        if r.same_as and not args.by_soc:
            return
        done[1] += 1
        shared = f" (same compilation as {r.same_as})" if r.same_as else ""
        print(f"[{done[0]}/{len(cases)}] {r.op} {r.dtype} {r.config} {r.soc}: {r.result} "
              f"({r.seconds:.2f} s){shared}{' ' + r.detail if r.detail else ''}", flush=True)

    t0 = time.perf_counter()
    results = run_cases(cases, jobs, keep=args.keep, bishengir=bishengir, progress=progress, per_soc=args.per_soc)
    wall = time.perf_counter() - t0
    print()
    print(format_table(results, by_soc=args.by_soc))
    if notes:
        print("\nnot compiled:\n" + "\n".join(f"  {n}" for n in notes))
    print()
    print(summary(results, wall))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
