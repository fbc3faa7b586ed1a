"""Timing uses the backend's own events; work counts bytes and FLOPs of the op, not the kernel."""

from __future__ import annotations

import pytest
import torch

import xkernels
from xkernels import interleave, peaks
from xkernels.backend import Backend, Figure, HostEvent
from xkernels.harness import Target, perf
from xkernels.harness.cases import Case, T, cases


class CountingBackend(Backend):
    name = "counting-test"
    device_type = "cpu"

    def __init__(self) -> None:
        self.events = 0
        self.syncs = 0

    def Event(self, enable_timing: bool = True):  # noqa: N802
        self.events += 1
        return HostEvent(enable_timing)

    def synchronize(self, device=None) -> None:
        self.syncs += 1

    def hold(self, microseconds: float) -> bool:
        self.held = [*getattr(self, "held", []), microseconds]
        return True


def test_time_calls_uses_backend_events_and_rotates_sets():
    backend = CountingBackend()
    seen = []
    settings = perf.Settings(warmup=2, warmup_s=0.0, min_reps=7, max_reps=7, budget_s=0.0, flush=True)
    t = perf.time_calls(seen.append, ["a", "b", "c"], Target(backend, torch.device("cpu")), settings)
    assert t.reps == 7 and backend.events == 14 and backend.syncs >= 3
    assert t.p20_ms <= t.median_ms <= t.p80_ms
    assert seen[-7:] == ["a", "b", "c", "a", "b", "c", "a"]
    assert backend.held == [perf.HOLD_US] * 7  # the device held busy before each timed call only


def test_work_counts_distinct_input_bytes_and_output():
    inp = Case("broadcast", (T((4, 8), torch.float32), T((4, 8), torch.float32, "expanded")), "t",
               frozenset({"quick"})).make_inputs("cpu", 0)
    w = perf.work("broadcast", inp)
    assert w.bytes == (32 + 8 + 32) * 4 and w.flops == 32
    inp = Case("matmul", (T((3, 5, 7), torch.float16), T((7, 2), torch.float16)), "t",
               frozenset({"quick"})).make_inputs("cpu", 0)
    w = perf.work("matmul", inp)
    assert w.flops == 2 * 3 * 5 * 2 * 7 and w.bytes == (105 + 14 + 30) * 2


@pytest.mark.parametrize("speedup, label", [(1.5, ">=0.8x"), (0.8, ">=0.8x"), (0.79, "0.5-0.8x"),
                                            (0.5, "0.5-0.8x"), (0.3, "0.2-0.5x"), (0.1, "<0.2x")])
def test_bands(speedup, label):
    assert perf.band(speedup) == label


def test_ceilings_measured_once_then_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(tmp_path))
    calls = []

    def fake(kind, value, unit):
        def measure(target, n):
            calls.append(kind)
            return Figure(value, unit, "measured", "test")
        return measure

    monkeypatch.setattr(perf, "measure_copy_bandwidth", fake("copy", 10.0, "GB/s"))
    monkeypatch.setattr(perf, "measure_matmul_peak", fake("peak", 2.0, "TFLOP/s"))
    target = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    first, second = perf.ceilings(target), perf.ceilings(target)
    assert calls == ["copy", "peak"]
    assert first.copy_bandwidth.value == second.copy_bandwidth.value == 10.0
    assert first.ridge == pytest.approx(2e12 / 10e9)
    assert peaks.cached_figure("cpu", first.device_name, "matmul_peak").value == 2.0


def test_bench_case_row_on_cpu():
    target = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    ceil = perf.Ceilings("test cpu", *(Figure(v, u, "measured") for v, u in ((10.0, "GB/s"), (0.1, "TFLOP/s"))))
    case = cases(["linear"], [torch.float32], ["small"])[0]
    row = perf.bench_case(case, target, ceil, seed=0, settings=perf.FAST)
    assert row["bound"] == "compute" and row["tflops"] > 0 and row["host_ms"] > 0
    assert row["intensity"] > ceil.ridge == pytest.approx(10.0)
    assert row["pct_of_peak"] is None  # float32 on a cpu: the bf16 peak does not bound it
    assert row["pct_of_peak_omitted"] == "float32 on a cpu is not bounded by the bf16 matmul peak"
    assert row["input_sets"] == 2  # a 256x256 working set fits the assumed cache: inputs rotate
    high = perf.Ceilings("test cpu", Figure(1e4, "GB/s", "measured"), Figure(100.0, "TFLOP/s", "measured"))
    bf16 = perf.bench_case(cases(["linear"], [torch.bfloat16], ["small"])[0], target, high, seed=0, settings=perf.FAST)
    assert bf16["bound"] == "compute" and bf16["pct_of_peak_omitted"] is None
    assert bf16["pct_of_peak"] == pytest.approx(100 * bf16["tflops"] / 100.0)


def test_percent_of_peak_only_where_the_ceiling_bounds_the_case():
    """On a cpu: memory-bound only with a working set >= 4x the last-level cache, compute-bound
    only in bf16 (the ceiling's dtype); on an accelerator (cache flushed per call) always."""
    figs = (Figure(10.0, "GB/s", "measured"), Figure(0.1, "TFLOP/s", "measured"))
    llc = perf.Ceilings("test cpu", *figs, cache_bytes=32 << 20)
    cpu = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    small = perf.peak_misleads("memory", 12 << 20, torch.float32, cpu, llc)
    assert small == ("working set 12 MiB is under 4x the 32 MiB last-level cache: cache-resident, "
                     "not bounded by the DRAM copy bandwidth")
    assert perf.peak_misleads("memory", (128 << 20) - 1, torch.float32, cpu, llc) is not None
    assert perf.peak_misleads("memory", 128 << 20, torch.float32, cpu, llc) is None
    assert "(assumed)" in perf.peak_misleads("memory", 1 << 20, torch.float32, cpu, perf.Ceilings("c", *figs))
    assert perf.peak_misleads("compute", 1 << 20, torch.float16, cpu, llc) is not None
    assert perf.peak_misleads("compute", 1 << 20, torch.bfloat16, cpu, llc) is None
    gpu = Target(xkernels.get_backend("cpu"), torch.device("cuda"))
    for bound, dtype in (("memory", torch.float32), ("compute", torch.float32)):
        assert perf.peak_misleads(bound, 1 << 10, dtype, gpu, llc) is None


def test_percent_above_100_is_never_shown():
    """A case faster than its ceiling shows that the figure does not bound it: no % then (a cpu's
    bf16 peak measured at 256^3 was beaten 14-fold by larger GEMMs)."""
    ceil = perf.Ceilings("c", Figure(10.0, "GB/s", "measured"), Figure(0.1, "TFLOP/s", "measured"))
    assert perf.above_ceiling(100.0, "memory", ceil) is None
    why = perf.above_ceiling(1466.0, "compute", ceil)
    assert "1466% of the bf16 matmul peak (0.1 TFLOP/s" in why and "does not bound" in why
    assert "copy bandwidth" in perf.above_ceiling(101.0, "memory", ceil)
    low = Figure(0.0013, "TFLOP/s", "measured", "bf16 256x256x256 torch.matmul; below 2048^3, " + perf.LOWER_BOUND_NOTE)
    cpu = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    lower_bound = perf.Ceilings("c", ceil.copy_bandwidth, low)
    assert "too small" in perf.peak_misleads("compute", 1 << 20, torch.bfloat16, cpu, lower_bound)


def test_bench_rows_never_exceed_100_percent(monkeypatch):
    """Whatever the cached ceilings say, a row's % of peak is at most 100."""
    figs = (Figure(1e-6, "GB/s", "measured"), Figure(1e-9, "TFLOP/s", "measured"))
    ceil = perf.Ceilings("tiny ceilings", *figs, cache_bytes=1 << 10)
    target = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    monkeypatch.setattr(perf, "peak_misleads", lambda *a: None)  # as if the ceilings bounded every case
    from xkernels.harness.cases import cases
    for case in [c for c in cases(["add", "linear"], [torch.bfloat16], ["quick"])][:2]:
        row = perf.bench_case(case, target, ceil, seed=0, settings=perf.Settings(warmup=1, min_reps=1, max_reps=2,
                                                                                  budget_s=0.01, flush=False))
        assert row["pct_of_peak"] is None and "does not bound" in row["pct_of_peak_omitted"]


def test_cpu_reports_its_last_level_cache():
    llc = xkernels.get_backend("cpu").properties().extra["llc_bytes"]
    import os
    if os.path.isdir("/sys/devices/system/cpu/cpu0/cache"):
        assert llc and llc >= 1 << 16
    else:
        assert llc is None


def test_confirm_interleaves_the_two_routes_and_reports_per_round_ratios():
    backend = CountingBackend()
    order = []
    c = perf.confirm(lambda: order.append("xk"), lambda: order.append("torch"), Target(backend, torch.device("cpu")),
                     rounds=4)
    # one warm-up round, then rounds alternating which route goes first
    assert order == ["xk", "torch", "xk", "torch", "torch", "xk", "xk", "torch", "torch", "xk"]
    assert c["rounds"] == 4 and len(c["ms"]) == 2 and c["spread"][0] <= c["ratio"] <= c["spread"][1]
    assert backend.held == [perf.HOLD_US] * 8


def test_short_calls_confirm_in_more_rounds():
    """A loss is confirmed in ``confirm_rounds`` rounds, more for a call too short for each side
    to time ``confirm_ms`` in them (a few-µs call's single timing jitters ~10%), at most 5x."""
    full = perf.FULL
    assert perf.confirm_rounds(full, 0.5) == full.confirm_rounds  # 9 x 0.5 ms > 1 ms
    assert perf.confirm_rounds(full, 0.05) == 20
    assert perf.confirm_rounds(full, 0.005) == 5 * full.confirm_rounds
    assert perf.confirm_rounds(full, 0.0) == full.confirm_rounds
    assert perf.confirm_rounds(perf.FAST, 0.001) == 5 * perf.FAST.confirm_rounds


def test_confirmed_summary_takes_the_re_measured_ratio_where_there_is_one():
    rows = [{"op": "linear", "dtype": "bfloat16", "shape": "a", "layout": "x", "speedup": 0.6, "confirmed": 0.98},
            {"op": "linear", "dtype": "bfloat16", "shape": "b", "layout": "y", "speedup": 1.5, "confirmed": None},
            {"op": "linear", "dtype": "bfloat16", "shape": "c", "layout": "z", "speedup": 0.9, "confirmed": 0.95},
            {"op": "linear", "dtype": "bfloat16", "shape": "d", "layout": "w", "error": "boom"}]
    s = perf.confirmed_summary(rows)
    assert s["rows"] == 3 and s["worst"] == 0.95 and s["worst_case"] == "linear bfloat16 c z"
    assert s["geomean"] == pytest.approx((0.98 * 1.5 * 0.95) ** (1 / 3))
    assert s["below_1_single_pass"] == 2 and s["below_1_confirmed"] == 2


def test_heldout_shapes_are_outside_the_corpus():
    from xkernels.harness import heldout, models

    corpus = set(models.model_names())
    linear = cases(["linear"], [torch.bfloat16], ["heldout"])
    matmul = cases(["matmul"], [torch.float16], ["heldout"])
    assert linear and matmul and all(c.sizes == {"heldout"} for c in linear + matmul)
    assert not {m for c in linear + matmul for m in c.models} & corpus
    tokens = {c.args[0].shape[0] for c in linear}
    assert set(heldout.shapes()["tokens"]) <= tokens
    acts = {c.args[3] if len(c.args) > 3 else None for c in linear}
    assert acts == {None, "relu", "gelu", "gelu_tanh", "silu", "leaky_relu"}
    assert any(len(c.args[0].shape) == 3 for c in matmul) and any(len(c.args[0].shape) == 2 for c in matmul)


def test_norm_forward_backward_rows(monkeypatch):
    """The fused norms' forward+backward rows: both sides run autograd against the same output
    gradients (the xkernels side through its own backward), every leaf's gradient computed, the
    backward's least traffic counted."""
    target = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    ceil = perf.Ceilings("test cpu", *(Figure(v, u, "measured") for v, u in ((10.0, "GB/s"), (0.1, "TFLOP/s"))))
    picked = [c for c in cases(["add_layer_norm", "add_rms_norm"], [torch.float32], ["small"]) if c.backward]
    assert {c.op for c in picked} == {"add_layer_norm", "add_rms_norm"}
    assert all(c.layout.endswith("forward+backward") for c in picked)
    small = Case("add_layer_norm", (T((6, 40), torch.float32), T((6, 40), torch.float32), T((40,), torch.float32),
                                    T((40,), torch.float32)), "forward+backward", frozenset({"small"}), backward=True)
    inputs, grads = perf.with_grads(small.make_inputs("cpu", 0), 0)
    got = perf.backward_call(xkernels.ops.add_layer_norm)((inputs, grads))
    want = perf.backward_call(perf.OPS["add_layer_norm"].torch_fn)((inputs, grads))
    assert len(got) == len(want) == 4
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    row = perf.bench_case(small, target, ceil, seed=0, settings=perf.FAST)
    forward_only = perf.work("add_layer_norm", small.make_inputs("cpu", 0)).bytes
    assert row["bytes"] == forward_only + 4 * 6 * 40 * 4 + 2 * 40 * 4 and row["time_ms"] > 0


@pytest.mark.uses_interpreter
def test_rotary_forward_backward_rows():
    """rotary_embedding's forward+backward rows: q and k are the leaves (not the cos / sin tables,
    whose grad would send the op to PyTorch's formula), one random gradient per result (k has the kv
    heads), the kernel's backward on the interpreter matches torch's, and the backward's least
    traffic is the gradients of the results read and of q and k written, cos and sin read again."""
    picked = [c for c in cases(["rotary_embedding"], [torch.float32], ["small", "medium", "large"]) if c.backward]
    assert picked and all(c.layout.endswith("forward+backward") for c in picked)
    from xkernels.harness.cases import rotary_args

    small = Case("rotary_embedding", rotary_args(torch.float32, 2, 5, 4, 2, 16, 8), "forward+backward",
                 frozenset({"small"}), backward=True)
    inputs, grads = perf.with_grads(small.make_inputs("cpu", 0), 0, small.op)
    q, k, cos, sin = inputs.args
    assert q.requires_grad and k.requires_grad and not cos.requires_grad and not sin.requires_grad
    assert [g.shape for g in grads] == [q.shape, k.shape]
    want = perf.backward_call(perf.OPS["rotary_embedding"].torch_fn)((inputs, grads))
    with xkernels.use_backend("interpreter"):
        got = perf.backward_call(xkernels.ops.rotary_embedding)((inputs, grads))
        assert "triton kernel" in xkernels.ops.rotary_embedding.explain(*inputs.args).route
    assert len(got) == len(want) == 2
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    forward = perf.work("rotary_embedding", small.make_inputs("cpu", 0))
    both = perf.work("rotary_embedding", small.make_inputs("cpu", 0), backward=True)
    q_bytes, k_bytes, table = 2 * 4 * 5 * 16 * 4, 2 * 2 * 5 * 16 * 4, 5 * 8 * 4
    assert forward.bytes == 2 * (q_bytes + k_bytes) + 2 * table
    assert both.bytes == forward.bytes + 2 * (q_bytes + k_bytes) + 2 * table
    target = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    ceil = perf.Ceilings("test cpu", *(Figure(v, u, "measured") for v, u in ((10.0, "GB/s"), (0.1, "TFLOP/s"))))
    row = perf.bench_case(small, target, ceil, seed=0, settings=perf.FAST)
    assert row["bytes"] == both.bytes and row["time_ms"] > 0 and row["torch_time_ms"] > 0


class ReplayingBackend(CountingBackend):
    """Records a call by wrapping it: a replay appends ("replay", tag) instead of running host code."""

    name = "replaying-test"

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()
        self.refuse, self.recorded = refuse, 0

    def replayable(self, fn):
        if self.refuse:
            return None
        self.recorded += 1
        fn()  # recording runs it once
        return lambda: fn()


def test_short_calls_are_confirmed_as_replays_where_the_backend_records_them():
    """Below interleave.REPLAY_BELOW_MS both sides are recorded and their replays timed; a backend
    that cannot record one side leaves both eager; a long call and a cpu target stay eager."""
    order = []
    xk, th = (lambda: order.append("xk")), (lambda: order.append("torch"))
    meta = torch.device("meta")  # an accelerator's device type; the backend runs nothing on it
    backend = ReplayingBackend()
    c = perf.confirm(xk, th, Target(backend, meta), rounds=2, call_ms=interleave.REPLAY_BELOW_MS / 2)
    assert c["replayed"] is True and backend.recorded == 2 and c["rounds"] == 2
    assert perf.confirm(xk, th, Target(ReplayingBackend(refuse=True), meta), rounds=2, call_ms=0.001)["replayed"] is False
    for target, ms in ((Target(ReplayingBackend(), meta), 10 * interleave.REPLAY_BELOW_MS),
                       (Target(ReplayingBackend(), torch.device("cpu")), 0.001), (Target(ReplayingBackend(), meta), None)):
        assert perf.confirm(xk, th, target, rounds=2, call_ms=ms)["replayed"] is False
        assert target.backend.recorded == 0


def test_time_calls_replays_each_input_set_of_a_short_call():
    backend, seen = ReplayingBackend(), []
    t = perf.time_calls(seen.append, ["a", "b", "c"], Target(backend, torch.device("meta")), perf.FAST, replay=True)
    assert t.replayed and backend.recorded == 3 and {"a", "b", "c"} <= set(seen)
    t = perf.time_calls(seen.append, ["a"], Target(ReplayingBackend(refuse=True), torch.device("meta")), perf.FAST,
                        replay=True)
    assert not t.replayed
    assert not perf.time_calls(seen.append, ["a"], Target(backend, torch.device("meta")), perf.FAST).replayed


def test_bench_times_both_sides_the_same_way(monkeypatch):
    """Where xkernels' call is recorded but torch's cannot be, xkernels' is re-timed eagerly: a
    row never compares a replay with an eager timing."""
    calls = []

    def fake_time_calls(fn, sets, target, settings=perf.FULL, hold_us=perf.HOLD_US, replay=False):
        calls.append(replay)
        replayed = replay and len(calls) == 1  # xkernels' side records, torch's does not
        return perf.Timing(1.0, 1.0, 1.0, 3, replayed)

    case = next(c for c in cases(ops=["add"], sizes=["small"], dtypes=[torch.float32]))
    target = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    ceil = perf.ceilings(target)
    monkeypatch.setattr(perf, "time_calls", fake_time_calls)
    row = perf.bench_case(case, target, ceil, 0, perf.FAST)
    assert calls == [True, True, False] and row["replayed"] is False


def test_an_inconclusive_confirmation_is_extended_and_judged_on_all_its_rounds(monkeypatch):
    """A loss whose rounds disagree widely (p20 < 0.95, p80 >= 1.0) gets 2x its rounds more and
    the verdict is the median of all rounds, none dropped; a consistent loss is not extended."""
    scripts = []

    def fake_confirm(fn, torch_fn, target, rounds, flush=True, call_ms=None):
        times = scripts.pop(0)
        assert len(times) == rounds
        return {**interleave.summary(times), "replayed": False, "times": times}

    monkeypatch.setattr(perf, "confirm", fake_confirm)
    target = Target(CountingBackend(), torch.device("cpu"))
    settings = perf.Settings(confirm_rounds=9, confirm_ms=0.0)
    slow_rounds = [[1.0, 0.6]] * 5 + [[1.0, 1.0]] * 4  # xkernels' side slow in 5 of 9 rounds
    assert perf.inconclusive(interleave.summary(slow_rounds))
    scripts[:] = [slow_rounds, [[1.0, 1.0]] * 18]
    c = perf.confirm_loss(lambda: None, lambda: None, target, settings, 0.3)
    assert c["extended"] and c["rounds"] == 27 and c["ratio"] == 1.0 and "times" not in c and not scripts
    scripts[:] = [slow_rounds, [[1.0, 0.6]] * 18]  # the loss shows again: it stands
    c = perf.confirm_loss(lambda: None, lambda: None, target, settings, 0.3)
    assert c["extended"] and c["ratio"] == pytest.approx(0.6)
    scripts[:] = [[[1.0, 0.9]] * 9]  # a consistent 0.9x: confirmed as it is
    c = perf.confirm_loss(lambda: None, lambda: None, target, settings, 0.3)
    assert not c["extended"] and c["rounds"] == 9 and c["ratio"] == pytest.approx(0.9) and not scripts
    assert not perf.inconclusive({"ratio": 1.02, "spread": [0.9, 1.1]})  # no loss to confirm
