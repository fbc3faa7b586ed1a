"""Sweep kernel configs on this device (or on every rank ``torchrun`` starts) and write tuning tables.

    python -m xkernels.tune --backend cuda --op linear --shapes models --dtype bf16 --out-dir tune-out
    torchrun --nproc-per-node 4 -m xkernels.tune --backend cuda --op linear --shapes models --out-dir tune-out
    python -m xkernels.tune --export-cache --backend cuda --out-dir tables

Plan, measure, choose (see ``xkernels.sweep``): the (case x candidate config) items of a shape
set are split across the ranks, each measures its share on its local device (checked against
PyTorch, timed with the harness timer, failures recorded) and checkpoints every record; rank 0
gathers them and writes, per op, ``<out-dir>/<op>.json`` (a table for the device's arch, with a
``"sweep"`` record: world size, items, items per rank, failed items, wall seconds) and
``<out-dir>/<op>.measurements.jsonl``. Rules come from the measurements the same way whatever
the number of processes:

* ``matmul`` / ``linear``: ``xkernels.cli.matmul_tables`` (joint (M, N, K) rules per dtype and
  epilogue, each recording the shapes it was measured on and its worst ratio to PyTorch, plus
  candidates with fitted costs);
* ``add`` / ``broadcast``: per (kernel variant, dtype, size class), the config whose worst
  slowdown against the best config of each measured case is smallest (:func:`elementwise_rules`).

A restarted sweep with the same ``--out-dir`` measures only what its checkpoints lack.
``--install DIR`` merges the swept arch's rules into ``DIR/<op>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

import xkernels
from xkernels import sweep
from xkernels.cli import matmul_tables
from xkernels.cli.sweep_world import Progress, World, join
from xkernels.harness import Target
from xkernels.harness.cases import parse_dtype
from xkernels.sweep_timing import Phases, describe


def _dtypes_for(dt: str, measured: set[str]) -> list[str]:
    """The dtypes a rule measured in ``dt`` serves: bf16 also serves fp16 when fp16 was not measured."""
    return [dt] + (["float16"] if dt == "bfloat16" and "float16" not in measured else [])


def _numel_class(numel: int) -> tuple[int, int]:
    return next((lo, hi) for lo, hi, _ in sweep.NUMEL_CLASSES if lo <= numel <= hi)


def elementwise_rules(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rules of measured element-wise rows: per (variant, dtype, size class), among the configs
    that ran on every case of the class, the one whose largest ratio to each case's fastest
    config is smallest (then the smallest total time)."""
    measured = {r["dtype"] for r in rows}
    groups: dict[tuple[str, str, tuple[int, int]], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["dtype"], r["variant"], _numel_class(r["numel"])), []).append(r)
    out = []
    for (dt, variant, (lo, hi)), group in sorted(groups.items()):
        times: dict[str, list[float]] = {}
        cfgs: dict[str, dict[str, Any]] = {}
        for r in group:
            for c in r["cfgs"]:
                if "ms" in c:
                    key = json.dumps(c["cfg"], sort_keys=True)
                    cfgs[key] = c["cfg"]
                    times.setdefault(key, []).append(c["ms"])
        best_case = [min((c["ms"] for c in r["cfgs"] if "ms" in c), default=None) for r in group]
        full = {k: ms for k, ms in times.items() if len(ms) == len(group)}
        if not full or None in best_case:
            continue
        key = min(full, key=lambda k: (max(ms / b for ms, b in zip(full[k], best_case)), sum(full[k]), k))
        ms = full[key]
        out.append({"when": {"variant": variant, "dtype": _dtypes_for(dt, measured), "numel_min": lo, "numel_max": hi},
                    "config": cfgs[key],
                    "measured": {"shapes": [r["shape"] for r in group], "ms": [round(v, 5) for v in ms],
                                 "torch_ms": [round(r["torch_ms"], 5) for r in group],
                                 "worst_ratio": round(min(r["torch_ms"] / v for r, v in zip(group, ms)), 3),
                                 "worst_vs_best": round(max(v / b for v, b in zip(ms, best_case)), 3)}})
    return out


def matmul_rules(rows: list[dict[str, Any]], units: int) -> dict[str, dict[str, Any]]:
    """``xkernels.cli.matmul_tables.build`` per measured dtype: ``{dtype: {"dtypes", "rules", "candidates"}}``."""
    measured = {r["dtype"] for r in rows}
    out = {}
    for dt in sorted(measured):
        dts = _dtypes_for(dt, measured)
        built = matmul_tables.build([r for r in rows if r["dtype"] == dt], units, dts)
        built["candidates"] = [g for g in built["candidates"] if g["configs"]]
        out[dt] = {"dtypes": dts, **built}
    return out


def table(op: str, backend: xkernels.Backend, rows: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """The table of one op from its measurement rows (see the module doc)."""
    arch = backend.arch()
    t: dict[str, Any] = {"op": op, "backend": backend.name, "source": source, "archs": {arch: []}}
    if op in sweep.MATMUL_OPS:
        by_dtype = matmul_rules(rows, backend.compute_units() or 1)
        t["archs"][arch] = [r for b in by_dtype.values() for r in b["rules"]]
        cands = [g for b in by_dtype.values() for g in b["candidates"]]
        if cands:
            t["candidates"] = {arch: cands}
    else:
        t["archs"][arch] = elementwise_rules(rows)
    return t


def run(op: str, backend_name: str, shapes: str, out_dir: Path, dtypes: list[torch.dtype] | None = None,
        models: list[str] | None = None, timer: sweep.Timer | None = None, reps: int = 0, seed: int = 0,
        world: World | None = None) -> dict[str, Any] | None:
    """Sweep ``op`` (this rank's share) and, on rank 0, write and return its table."""
    t0 = time.perf_counter()
    phases = Phases()
    backend = xkernels.get_backend(backend_name)
    backend.require_available()
    world = world or join(backend.device_type)
    target = Target(backend, torch.device(backend.device_type))
    confirm_loss = sweep.confirm_for(target, timer)  # a loss is confirmed in interleaved rounds before it counts
    timer = timer or sweep.timer_for(target, reps)
    arch = backend.arch()
    with phases("plan_s"):
        planned = sweep.plan(op, backend, shapes, dtypes, models)
        mine = sweep.assign(planned, world.size)
        ckpt = sweep.Checkpoint(out_dir, op, world.rank, backend.name, arch)
    with phases("sync_s"):
        world.barrier()  # every rank reads the checkpoints before any writes
    with phases("plan_s"):
        done = ckpt.load()
    with phases("sync_s"):
        world.barrier()
    total = sum(len(sc.configs) for sc in planned)
    progress = Progress(world, total, f"xkernels.tune {op} ({shapes})")
    my_items = [iid for i in mine[world.rank] for iid in planned[i].item_ids()]
    resumed = sum(iid in done for iid in my_items)
    with phases("progress_s"):
        progress.resumed(resumed)
    measured = 0

    def step(rec: dict[str, Any]) -> None:
        nonlocal measured
        measured += 1
        with phases("progress_s"):
            progress.step(rec)

    records: dict[str, dict[str, Any]] = {}
    for i in mine[world.rank]:
        for rec in sweep.measure_case(planned[i], target, timer, done, ckpt.append, seed, on_item=step,
                                      phases=phases, order=(world.rank, world.size), confirm_loss=confirm_loss):
            records[rec["key"]] = rec
    with phases("sync_s"):
        progress.wait_for_others()
    stats = phases.report(world.rank, items=len(my_items), measured=measured, resumed=resumed)
    with phases("sync_s"):
        gathered = world.gather((records, stats))
    if gathered is None:
        return None
    t_tables = time.perf_counter()
    merged: dict[str, dict[str, Any]] = {}
    for recs, _ in gathered:
        merged.update(recs)
    rows = sweep.rows(planned, merged)
    props = backend.properties()
    source = (f"python -m xkernels.tune --backend {backend_name} --op {op} --shapes {shapes}; {props.name}; "
              f"{datetime.date.today()}; torch {torch.__version__}; triton {_triton_version()}")
    result = table(op, backend, rows, source)
    failed = [{"case": r["case"], "cfg": r["cfg"], "err": r["err"]} for r in merged.values() if "err" in r]
    ranks = [s for _, s in gathered]
    result["sweep"] = {"world_size": world.size, "items": total, "items_per_rank": [s["items"] for s in ranks],
                       "failed": failed, "not_applicable": sum("not_applicable" in r for r in merged.values()),
                       "resumed": sum(s["resumed"] for s in ranks), "measured": sum(s["measured"] for s in ranks),
                       "seconds": 0.0, "shapes": shapes, "ranks": ranks}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{op}.measurements.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # rank 0's table time (building, plus writing the measurements) joins its breakdown
    ranks[0]["tables_s"] = round(time.perf_counter() - t_tables, 3)
    ranks[0]["wall_s"] = round(ranks[0]["wall_s"] + ranks[0]["tables_s"], 3)
    result["sweep"]["seconds"] = round(time.perf_counter() - t0, 2)
    (out_dir / f"{op}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"xkernels.tune {op}: {len(result['archs'][arch])} rules from {len(rows)} cases, {total} items on "
          f"{world.size} process(es), {len(failed)} failed, {result['sweep']['not_applicable']} not applicable, "
          f"{result['sweep']['measured']} measured, {result['sweep']['resumed']} resumed from checkpoints, "
          f"{result['sweep']['seconds']} s -> {out_dir / (op + '.json')}\n"
          f"xkernels.tune {op}: where the time went (seconds per rank):\n{describe(ranks)}", flush=True)
    return result


def install(result: dict[str, Any], path: Path) -> None:
    """Merge a sweep's table into the table at ``path``: for matmul/linear the swept dtypes'
    rules and candidates of the arch are replaced (``matmul_tables.install``); for element-wise
    ops the swept arch's rules are replaced. Other archs stay."""
    arch = next(iter(result["archs"]))
    if result["op"] in sweep.MATMUL_OPS:
        dtypes = sorted({d for r in result["archs"][arch] for d in r["when"].get("dtype", [])})
        built = {"rules": result["archs"][arch], "candidates": result.get("candidates", {}).get(arch, [])}
        matmul_tables.install(path, arch, built, result["source"], dtypes)
        return
    old = json.loads(path.read_text()) if path.exists() else {"op": result["op"], "backend": result["backend"],
                                                              "archs": {}}
    old["archs"][arch] = result["archs"][arch]
    old["source"] = result["source"] + ". Other archs: kept from the previous table."
    path.write_text(json.dumps(old, indent=1) + "\n")


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "none"


def main(argv: list[str] | None = None, timer: sweep.Timer | None = None) -> int:
    """The CLI; ``timer`` replaces the harness timer (tests: a deterministic one)."""
    p = argparse.ArgumentParser(prog="python -m xkernels.tune", description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--op", default="broadcast,add,matmul")
    p.add_argument("--shapes", default="seed", choices=sweep.SHAPE_SETS,
                   help="models: the real-model corpus; seed: one shape per size class; quick: small (CI)")
    p.add_argument("--dtype", action="append", help="only these dtypes (repeat or comma-separate)")
    p.add_argument("--model", action="append", help="with --shapes models: only these models' shapes")
    p.add_argument("--out-dir", type=Path, default=Path("tune-out"))
    p.add_argument("--reps", type=int, default=0, help="timed calls per config (default: a time budget)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--install", type=Path, default=None, metavar="TABLE_DIR",
                   help="also merge the swept arch's rules into TABLE_DIR/<op>.json, e.g. ops/tuning/cuda")
    p.add_argument("--export-cache", action="store_true",
                   help="write the autotune cache of --backend as tables to --out-dir (nothing is measured)")
    a = p.parse_args(argv)
    if a.export_cache:
        from xkernels import autotune

        written = autotune.export(a.backend, a.out_dir)
        print("\n".join(f"xkernels.tune: wrote {w}" for w in written) or
              f"xkernels.tune: the autotune cache of {a.backend!r} is empty ({autotune.cache_dir(a.backend)})")
        return 0
    reason = xkernels.get_backend(a.backend).unavailable_reason()
    if reason:
        print(f"xkernels.tune: backend {a.backend!r} is not available: {reason}", file=sys.stderr)
        return 2
    split = lambda vs: [v.strip() for arg in vs or () for v in arg.split(",") if v.strip()]  # noqa: E731
    world = join(xkernels.get_backend(a.backend).device_type)
    try:
        dtypes = [parse_dtype(d) for d in split(a.dtype)] or None
        models = split(a.model) or None
        for op in split([a.op]):
            result = run(op, a.backend, a.shapes, a.out_dir, dtypes, models, timer, a.reps, a.seed, world)
            if result is not None and a.install is not None:
                install(result, a.install / f"{op}.json")
    except ValueError as exc:
        print(f"xkernels.tune: {exc}", file=sys.stderr)
        return 2
    finally:
        world.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
