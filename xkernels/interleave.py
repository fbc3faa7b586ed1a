"""Interleaved timing of competing routes with the backend's own events.

A single timing pass per route (all of A, then all of B) is exposed to whatever drifts in
between: clocks, a neighbour's load, the host. On the H100, single passes gave 0.49-0.64x on four
held-out layers that re-measured 0.98-1.35x. Interleaving puts the routes side by side: round
``r`` runs every route once, in turn (the order reversed on odd rounds, so neither always goes
first), each behind a cache-flushing write where the device has a cache to flush and behind
``Backend.hold`` where the backend can hold the device busy (host dispatch then never counts as
device time). Every comparison is made per round (:func:`ratios`), so a drift between rounds
meets both sides. Calls of a few microseconds carry a bias of their own when timed eagerly (the
same call read up to 10% apart as routes 0 and 1, consistently): callers time them as replays
of recorded calls where the backend can record them (:func:`replayed`, ``REPLAY_BELOW_MS``).

Used by the matmul/linear first-use check (``ops/matmul/evidence.py``) and by ``bench`` and
``tune`` to confirm a loss before reporting or acting on it (``xkernels.harness.perf.confirm``).
This module depends only on the backend contract.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from xkernels.backend import Backend

#: Bytes written before each timed call when the device reports no L2 size.
DEFAULT_FLUSH_BYTES = 64 << 20
#: Device time queued before each timed call (``Backend.hold``), microseconds.
HOLD_US = 100.0
#: Calls shorter than this (milliseconds of device time) are timed as replays where the backend
#: can record them (``Backend.replayable``). Eagerly, identical ``torch.matmul`` calls of 5-8 us
#: timed in interleaved rounds as the routes 0 and 1 read 0.96x to 1.10x of each other, the same
#: way in five repeats of 45 rounds; replayed as CUDA graphs, 1.00x to 1.02x; at 29 us, 0.98x
#: and 1.00x (H100, results/2026-11-25-h100-timing-bias).
REPLAY_BELOW_MS = 0.05


def flush_bytes(backend: Backend, device: torch.device) -> int:
    """Twice the device's L2 (``properties().extra["l2_bytes"]``), at least 8 MiB; 0 on a cpu."""
    if device.type == "cpu":
        return 0
    try:
        l2 = backend.properties(device).extra.get("l2_bytes")
    except Exception:  # noqa: BLE001 - an odd device's properties must not fail a timing
        l2 = None
    return max(2 * int(l2), 8 << 20) if l2 else DEFAULT_FLUSH_BYTES


def time_rounds(fns: Sequence[Callable[[], Any]], backend: Backend, device: torch.device, rounds: int, *,
                warmup: int = 1, flush: int | None = None, hold_us: float = HOLD_US) -> list[list[float]]:
    """``rounds`` rounds of every ``fns[i]()`` once, interleaved (see the module doc): per round
    the device milliseconds of each function, ``[[t_0, t_1, ...], ...]``. ``warmup`` untimed
    rounds first (compilation, allocator). ``flush``: bytes written before each timed call
    (default :func:`flush_bytes`; 0: none)."""
    if rounds < 1:
        raise ValueError(f"xkernels.interleave.time_rounds: 'rounds' must be >= 1, got {rounds}")
    n = len(fns)
    nbytes = flush_bytes(backend, device) if flush is None else flush
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None
    for _ in range(warmup):
        for fn in fns:
            fn()
    backend.synchronize(device)
    events = [[(backend.Event(enable_timing=True), backend.Event(enable_timing=True)) for _ in range(n)]
              for _ in range(rounds)]
    for r in range(rounds):
        order = range(n) if r % 2 == 0 else range(n - 1, -1, -1)
        for i in order:
            if buf is not None:
                buf.zero_()
            backend.hold(hold_us)
            start, end = events[r][i]
            start.record()
            fns[i]()
            end.record()
    backend.synchronize(device)
    return [[s.elapsed_time(e) for s, e in row] for row in events]


def replayed(fns: Sequence[Callable[[], Any]], backend: Backend) -> list[Callable[[], Any]] | None:
    """Every one of ``fns`` recorded for replay (``Backend.replayable``), or ``None`` if any one
    cannot be: routes that are compared are timed the same way."""
    out = []
    for fn in fns:
        replay = backend.replayable(fn)
        if replay is None:
            return None
        out.append(replay)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation)."""
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def ratios(times: Sequence[Sequence[float]], num: int = 1, den: int = 0) -> list[float]:
    """Per round, ``times[r][num] / times[r][den]``: with routes (candidate, reference) and the
    defaults, how many times faster the candidate ran than the reference in each round."""
    return [row[num] / max(row[den], 1e-12) for row in times]


def summary(times: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Medians of each route, and the median and p20/p80 of the per-round ratios route 1 /
    route 0 (the speedup of route 0 over route 1)."""
    rs = ratios(times)
    return {"ms": [percentile([row[i] for row in times], 0.5) for i in range(len(times[0]))],
            "ratio": percentile(rs, 0.5), "spread": [percentile(rs, 0.2), percentile(rs, 0.8)],
            "rounds": len(times)}
