"""xkernels/interleave.py: interleaved rounds (order alternates, per-round ratios) and their summary."""

from __future__ import annotations

import pytest
import torch

from xkernels import interleave
from xkernels.registry import registry


def test_rounds_alternate_the_order_and_time_every_route_once_per_round():
    backend = registry.backend("cpu")
    calls = []
    fns = [lambda i=i: calls.append(i) for i in range(3)]
    times = interleave.time_rounds(fns, backend, torch.device("cpu"), rounds=4, warmup=1)
    assert len(times) == 4 and all(len(row) == 3 and all(t >= 0 for t in row) for row in times)
    assert calls == [0, 1, 2] + [0, 1, 2] + [2, 1, 0] + [0, 1, 2] + [2, 1, 0]  # warm-up, then alternating
    with pytest.raises(ValueError, match="'rounds' must be >= 1, got 0"):
        interleave.time_rounds(fns, backend, torch.device("cpu"), rounds=0)


def test_summary_compares_per_round_so_a_drift_meets_both_routes():
    """Round times drifting 10x between rounds: each round's ratio is still 2 (route 1 twice as
    long as route 0), whatever the medians of the routes are."""
    times = [[1.0, 2.0], [10.0, 20.0], [3.0, 6.0], [0.5, 1.0], [7.0, 14.0]]
    s = interleave.summary(times)
    assert s["ratio"] == pytest.approx(2.0) and s["spread"] == pytest.approx([2.0, 2.0])
    assert s["ms"] == [3.0, 6.0] and s["rounds"] == 5
    assert interleave.ratios(times, num=0, den=1) == pytest.approx([0.5] * 5)


def test_percentile_interpolates_and_flush_is_zero_on_cpu():
    assert interleave.percentile([4, 1, 3, 2], 0.5) == pytest.approx(2.5)
    assert interleave.percentile([1, 2, 3, 4, 5], 0.2) == pytest.approx(1.8)
    assert interleave.flush_bytes(registry.backend("cpu"), torch.device("cpu")) == 0


def test_replayed_records_every_route_or_none():
    """Routes compared are timed the same way: all recorded, or (one refusing) none; a backend
    that cannot record (the base contract, cpu) refuses."""
    class Recording(type(registry.backend("cpu"))):
        def __init__(self, refuse_index: int | None = None) -> None:
            self.refuse_index, self.seen = refuse_index, []

        def replayable(self, fn):
            i = len(self.seen)
            self.seen.append(fn)
            return None if i == self.refuse_index else (lambda: ("replay", i))

    fns = [lambda: 0, lambda: 1]
    backend = Recording()
    replays = interleave.replayed(fns, backend)
    assert [r() for r in replays] == [("replay", 0), ("replay", 1)] and backend.seen == fns
    assert interleave.replayed(fns, Recording(refuse_index=1)) is None
    assert interleave.replayed(fns, registry.backend("cpu")) is None
