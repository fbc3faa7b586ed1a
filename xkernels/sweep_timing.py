"""Where a sweep's time goes, per rank: the breakdown ``python -m xkernels.tune`` reports.

A :class:`Phases` accumulates wall seconds per phase of one rank's sweep:

* ``plan_s``: planning the items and reading the checkpoints (the start barriers excluded);
* ``first_call_s``: each config's first call: ``explain``, the call, the check against the
  float64 reference and the input comparison; this is where a config's kernel is compiled
  (Triton's compiler, the launcher's C module, loading the binary), so it includes ``compile_s``;
* ``compile_s``: Triton's compiler itself (``triton.knobs.compilation.listener``: the compile
  stages of each cache miss, ``compiles``; ``cache_hits`` were read from the Triton cache);
  0 under the interpreter, which compiles nothing;
* ``timing_s``: the timer's calls (warm-up, flushes and timed repetitions) of the configs and of
  torch's call (``torch_timing_s`` of it for torch alone);
* ``inputs_s``: making each case's inputs and its float64 reference;
* ``progress_s``: counting finished items in the rendezvous store (one round trip per item);
* ``sync_s``: the start barriers, waiting at the end for the other ranks (load imbalance: rank 0
  keeps the progress bar moving) and the gather of every rank's records on rank 0;
* ``tables_s`` (rank 0): building and writing the tables;
* ``wall_s``: the whole ``run`` of this rank; ``other_s`` what none of the above covers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

PHASES = ("plan_s", "inputs_s", "first_call_s", "compile_s", "timing_s", "torch_timing_s", "progress_s", "sync_s",
          "tables_s")
#: phases that are part of another one (not added again to the covered total)
NESTED = {"compile_s": "first_call_s", "torch_timing_s": "timing_s"}


class Phases:
    """Seconds per phase (see the module doc) and compile counts of one rank."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.counts: dict[str, int] = {"compiles": 0, "cache_hits": 0}
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t0

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds

    @contextlib.contextmanager
    def compiles(self) -> Iterator[None]:
        """Count Triton's compiles in the block (its compilation listener, chained to one that
        was set before; no Triton, nothing counted)."""
        try:
            from triton import knobs
        except ImportError:
            yield
            return
        before = knobs.compilation.listener

        def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
            if cache_hit:
                self.counts["cache_hits"] += 1
            else:
                self.counts["compiles"] += 1
                us = times.ir_initialization + sum(d for _, d in times.lowering_stages) + times.store_results
                self.seconds["compile_s"] += us * 1e-6
            if before is not None:
                before(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

        knobs.compilation.listener = listener
        try:
            yield
        finally:
            knobs.compilation.listener = before

    def report(self, rank: int, **extra: Any) -> dict[str, Any]:
        """This rank's breakdown as a JSON object (``extra``: items, measured, resumed, ...)."""
        wall = time.perf_counter() - self.start
        covered = sum(v for k, v in self.seconds.items() if k not in NESTED)
        return {"rank": rank, **extra, **{k: round(v, 3) for k, v in self.seconds.items()}, **self.counts,
                "other_s": round(max(0.0, wall - covered), 3), "wall_s": round(wall, 3)}


def describe(ranks: list[dict[str, Any]]) -> str:
    """One line per rank of :meth:`Phases.report` objects, for the sweep's summary."""
    lines = []
    for r in ranks:
        lines.append(f"  rank {r['rank']}: {r['wall_s']:.1f} s = first calls {r['first_call_s']:.1f} "
                     f"(Triton compiles {r['compile_s']:.1f} s, {r['compiles']} compiled, {r['cache_hits']} cached) "
                     f"+ timing {r['timing_s']:.1f} (torch {r['torch_timing_s']:.1f}) + inputs {r['inputs_s']:.1f} "
                     f"+ plan {r['plan_s']:.1f} + progress {r['progress_s']:.2f} + sync/wait {r['sync_s']:.1f} "
                     f"+ tables {r['tables_s']:.1f} + other {r['other_s']:.1f}; "
                     f"{r.get('measured', 0)} measured, {r.get('resumed', 0)} resumed")
    return "\n".join(lines)
