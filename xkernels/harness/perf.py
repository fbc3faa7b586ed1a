"""Timing of one case against PyTorch, and the device ceilings the results are measured against.

Timing (:func:`time_calls`) uses the backend's own events and ``synchronize``: warm-up, then
many repetitions (as many as fit a time budget, within bounds), median with p20/p80. Before each
timed call on an accelerator a buffer larger than any L2 (256 MiB) is written, so every call
starts with cold caches; then, where the backend can (``Backend.hold``), the device is kept busy
~200 µs more, so the call is queued before its start event runs and host dispatch time never
counts as device time. When a case's working set would fit in cache, its inputs are rotated
over several copies. Host-side time per call (:func:`host_time`) is wall time over many
back-to-back calls with one sync at the end: the launch/dispatch overhead small sizes are bound by.

Ceilings (:func:`ceilings`): copy bandwidth (large device-to-device copy, read + write counted)
and matmul peak (large bf16 ``torch.matmul`` on random data), measured once per device and cached
through :mod:`xkernels.peaks`; the backend's datasheet figures are carried beside them. A row's
% of its ceiling is given only where the ceiling bounds the case (:func:`peak_misleads`): on an
accelerator (cold cache every call); on a cpu, a memory-bound case whose working set is at least
:data:`CACHE_FACTOR` times the last-level cache, or a bf16 compute-bound case.
"""

from __future__ import annotations

import importlib.metadata
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from xkernels import dispatch, interleave, peaks
from xkernels.backend import Figure
from xkernels.dispatch import use_backend
from xkernels.harness import Target
from xkernels.harness.accuracy import op_function
from xkernels.harness.case import Case, Inputs, expected_result
from xkernels.harness.torch_ops import OPS

FLUSH_BYTES = 256 << 20
#: Device time queued before each timed call (``Backend.hold``): longer than the host needs to
#: queue one call of an op's full path (~50-130 us measured on an H100 host), so that host time
#: does not show up as device time.
HOLD_US = 200
#: A confirmation whose rounds disagree this widely (p20 below the first, p80 at or above the second)
#: is extended by ``EXTEND_ROUNDS`` times its rounds and judged on all of them (``confirm_loss``): on
#: the H100, a 340 us BLAS-routed matmul confirmed at 0.91x with a spread of 0.65-1.00, its
#: xkernels side slow in most of 9 rounds, and every pairing of the same calls read 0.999-1.002x
#: the next minute (results/2026-11-25-h100-heldout-matmul-replay, -timing-bias). A genuine loss
#: keeps showing in the extra rounds; a passing disturbance is outvoted without dropping a round.
INCONCLUSIVE = (0.95, 1.0)
EXTEND_ROUNDS = 2
#: ``time_calls(replay=True)``: a call whose first timed run (host, sync and device) took less than
#: this many milliseconds is timed as replays where the backend can record it.
REPLAY_ESTIMATE_MS = 1.0
#: Cache size assumed when the backend reports none (a generous last-level cache).
DEFAULT_CACHE_BYTES = 64 << 20
#: On a cpu, a memory-bound case is held to the copy bandwidth (a 256 MiB copy, from DRAM) only
#: when its working set is at least this many times the last-level cache (at most a quarter of it
#: can then be served from cache); smaller ones can run faster than the "ceiling".
CACHE_FACTOR = 4
#: Speed bands of xkernels relative to PyTorch (speedup = torch time / xkernels time).
BANDS = ((0.8, ">=0.8x"), (0.5, "0.5-0.8x"), (0.2, "0.2-0.5x"), (0.0, "<0.2x"))


@dataclass(frozen=True)
class Settings:
    """How hard to measure. ``FULL`` for real numbers, ``FAST`` for smoke runs."""

    warmup: int = 5  # at least this many warm-up calls ...
    warmup_s: float = 0.25  # ... and at least this long (lets other thread pools go quiet)
    min_reps: int = 10
    max_reps: int = 200
    budget_s: float = 1.0  # target time of the timed repetitions of one function
    host_calls: int = 200
    flush: bool = True
    max_sets: int = 32  # input copies rotated through when the working set fits in cache
    confirm_rounds: int = 9  # interleaved (xkernels, torch) rounds that confirm a row below 1.0x ...
    confirm_ms: float = 1.0  # ... at least this much of timed device time per side (short calls: more rounds)


FULL = Settings()
#: ``bench --size heldout``: hundreds of large GEMMs in one device call; shorter budgets, each
#: loss still confirmed in interleaved rounds.
BRIEF = Settings(warmup=3, warmup_s=0.05, min_reps=10, max_reps=100, budget_s=0.2)
FAST = Settings(warmup=1, warmup_s=0.1, min_reps=3, max_reps=10, budget_s=0.2, host_calls=20, flush=False, confirm_rounds=3,
                max_sets=2)


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    replayed: bool = False  # timed as replays (``Backend.replayable``)


def package_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (``None`` where it is not installed)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _percentile(sorted_ms: Sequence[float], q: float) -> float:
    pos = (len(sorted_ms) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def time_calls(fn: Callable[[Any], Any], sets: Sequence[Any], target: Target, settings: Settings = FULL,
               hold_us: float = HOLD_US, replay: bool = False) -> Timing:
    """Device time of ``fn(sets[i % len(sets)])`` per call, from the backend's events. Before
    each call the device is held busy for ``hold_us`` (where the backend can): a call that
    takes the host less than that to queue is timed as its kernels alone; a longer one (a
    whole model's forward) includes the host time the device waits for, unless ``hold_us``
    covers it too. ``replay``: a call whose first timed run (host and sync included) took less
    than ``REPLAY_ESTIMATE_MS`` is timed as replays of each set's recorded call, where the backend
    can record them (``interleave.REPLAY_BELOW_MS`` says why)."""
    backend, device = target.backend, target.device
    flush = None
    if settings.flush and device.type != "cpu":
        flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    i, t0 = 0, time.perf_counter()
    while i < settings.warmup or time.perf_counter() - t0 < settings.warmup_s:
        fn(sets[i % len(sets)])
        backend.synchronize(device)
        i += 1
    t0 = time.perf_counter()
    fn(sets[0])
    backend.synchronize(device)
    estimate = max(time.perf_counter() - t0, 1e-7)
    reps = int(min(settings.max_reps, max(settings.min_reps, settings.budget_s / estimate)))
    calls: Sequence[Callable[[], Any]] = [lambda s=s: fn(s) for s in sets]
    replays = (interleave.replayed(calls, backend) if replay and estimate * 1e3 < REPLAY_ESTIMATE_MS
               and device.type != "cpu" else None)
    calls = replays or calls
    starts = [backend.Event(enable_timing=True) for _ in range(reps)]
    ends = [backend.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.zero_()
        backend.hold(hold_us)  # the host queues the call while the device is still busy
        starts[i].record()
        calls[i % len(calls)]()
        ends[i].record()
    backend.synchronize(device)
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return Timing(_percentile(ms, 0.5), _percentile(ms, 0.2), _percentile(ms, 0.8), reps, replays is not None)


def confirm(fn: Callable[[], Any], torch_fn: Callable[[], Any], target: Target, rounds: int,
            flush: bool = True, call_ms: float | None = None) -> dict[str, Any]:
    """Re-measure a loss: ``rounds`` interleaved rounds of (``fn``, ``torch_fn``), each call alone
    behind a cache flush (on an accelerator) and the device hold, timed by the backend's events
    (``xkernels.interleave``). ``{"ms": [xkernels, torch] medians, "ratio": median of the
    per-round torch / xkernels, "spread": its [p20, p80], "rounds", "replayed"}``. One timing
    pass per side is exposed to drift between them: single passes gave 0.49-0.64x on four H100
    layers that re-measured 0.98-1.35x. Calls shorter than ``interleave.REPLAY_BELOW_MS``
    (``call_ms``) are timed as replays where the backend can record both sides (``replayed``)."""
    fns = [fn, torch_fn]
    replays = None
    if call_ms is not None and call_ms < interleave.REPLAY_BELOW_MS and target.device.type != "cpu":
        replays = interleave.replayed(fns, target.backend)
    times = interleave.time_rounds(replays or fns, target.backend, target.device, rounds,
                                   flush=None if flush else 0, hold_us=HOLD_US)
    return {**interleave.summary(times), "replayed": replays is not None, "times": times}


def inconclusive(conf: dict[str, Any]) -> bool:
    """A confirmation whose median says loss while its rounds disagree widely: the p20-p80 spread
    reaches below ``INCONCLUSIVE[0]`` and to ``INCONCLUSIVE[1]`` or above."""
    low, high = conf["spread"]
    return conf["ratio"] < 1.0 and low < INCONCLUSIVE[0] and high >= INCONCLUSIVE[1]


def confirm_loss(fn: Callable[[], Any], torch_fn: Callable[[], Any], target: Target, settings: Settings,
                 call_ms: float) -> dict[str, Any]:
    """:func:`confirm` in :func:`confirm_rounds` rounds; an :func:`inconclusive` one runs
    ``EXTEND_ROUNDS`` times as many rounds more and is judged on all its rounds together (none is
    dropped): ``"extended"`` says so. The per-round times are not returned."""
    rounds = confirm_rounds(settings, call_ms)
    conf = confirm(fn, torch_fn, target, rounds, settings.flush, call_ms=call_ms)
    extended = inconclusive(conf)
    if extended:
        more = confirm(fn, torch_fn, target, EXTEND_ROUNDS * rounds, settings.flush, call_ms=call_ms)
        conf = {**interleave.summary(conf["times"] + more["times"]), "replayed": conf["replayed"] and more["replayed"]}
    conf.pop("times", None)
    return {**conf, "extended": extended}


def confirm_rounds(settings: Settings, call_ms: float) -> int:
    """Rounds that confirm a loss of a call of ``call_ms``: ``settings.confirm_rounds``, more for a
    short call, so that each side times at least ``settings.confirm_ms`` (at most 5x as many).
    One timed call of a few µs jitters by ~10% on an H100; 9 such rounds confirmed BLAS-routed
    rows, the very aten call torch makes, at 0.92-0.95x (results/2026-11-24-h100-heldout-launch-margin)."""
    base = settings.confirm_rounds
    if call_ms <= 0:
        return base
    return int(min(5 * base, max(base, math.ceil(settings.confirm_ms / call_ms))))


def confirmed_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over rows with a speedup: the geomean and the worst of each row's ratio after confirmation
    (``confirmed`` where a row was re-measured, else ``speedup``), and how many rows were below
    1.0x before and after confirmation."""
    ok = [r for r in rows if r.get("speedup")]
    if not ok:
        return {"rows": 0}
    final = [r["confirmed"] if r.get("confirmed") is not None else r["speedup"] for r in ok]
    worst = min(range(len(ok)), key=lambda i: final[i])
    w = ok[worst]
    return {"rows": len(ok), "geomean": math.exp(sum(math.log(v) for v in final) / len(final)),
            "worst": final[worst], "worst_case": f"{w['op']} {w['dtype']} {w['shape']} {w['layout']}",
            "below_1_single_pass": sum(r["speedup"] < 1.0 for r in ok), "below_1_confirmed": sum(v < 1.0 for v in final)}


def host_time(fn: Callable[[Any], Any], inputs: Any, target: Target, settings: Settings, call_ms: float) -> float:
    """Wall milliseconds per call over back-to-back calls (``settings.host_calls``, fewer when a
    call takes ``call_ms`` long), one sync at the end."""
    calls = int(min(settings.host_calls, max(3, settings.budget_s * 1e3 / max(call_ms, 1e-6))))
    fn(inputs)
    target.backend.synchronize(target.device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(inputs)
    target.backend.synchronize(target.device)
    return (time.perf_counter() - t0) * 1e3 / calls


# -- work and roofline --------------------------------------------------------------------------
@dataclass(frozen=True)
class Work:
    """Bytes moved (inputs read once, output written once) and floating-point operations."""

    bytes: int
    flops: int


def _distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements of ``t`` (a stride-0 dim is read once)."""
    if t.numel() == 0:
        return 0
    n = math.prod(s for s, st in zip(t.shape, t.stride()) if st != 0)
    return n * t.element_size()


def work(op: str, inputs: Inputs, backward: bool = False) -> Work:
    """What one call of ``op`` on ``inputs`` must do, whatever the implementation. ``backward``
    (the forward+backward rows): plus the backward's least traffic. The fused norms: reading the
    sum, dy and the sum's gradient, writing d(x) (d(residual) is the same tensor) and the
    parameters' gradients. rotary_embedding: reading the gradients of q_embed and k_embed and
    the cos / sin tables again, writing those of q and k (cos / sin take none)."""
    with torch.no_grad():
        outs = expected_result(op, inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)  # (y, s) of the fused norms, rotary's (q, k)
    out = outs[0]
    tensors = list(inputs.named_tensors(OPS[op].arg_names).values())
    out_bytes = sum(o.numel() * o.element_size() for o in outs)
    nbytes = sum(_distinct_bytes(t) for t in tensors) + out_bytes
    if backward and op == "rotary_embedding":
        nbytes += 2 * out_bytes + sum(_distinct_bytes(t) for t in tensors[2:])
    elif backward:
        nbytes += 4 * out.numel() * out.element_size() + sum(_distinct_bytes(t) for t in tensors[2:])
    if OPS[op].matmul_like:
        return Work(nbytes, 2 * OPS[op].gemms * out.numel() * inputs.args[0].shape[-1])
    return Work(nbytes, out.numel())


def peak_misleads(bound: str, nbytes: int, dtype: torch.dtype, target: Target, ceil: Ceilings) -> str | None:
    """Why a case's % of its ceiling would mislead (the ceiling does not bound it), or ``None``."""
    if target.device.type != "cpu":
        return None
    if bound == "memory":
        cache = ceil.cache_bytes or DEFAULT_CACHE_BYTES
        if nbytes < CACHE_FACTOR * cache:
            known = "" if ceil.cache_bytes else " (assumed)"
            return (f"working set {nbytes / 2**20:.3g} MiB is under {CACHE_FACTOR}x the {cache >> 20} MiB last-level "
                    f"cache{known}: cache-resident, not bounded by the DRAM copy bandwidth")
        return None
    if dtype != torch.bfloat16:
        return f"{str(dtype).removeprefix('torch.')} on a cpu is not bounded by the bf16 matmul peak"
    if LOWER_BOUND_NOTE in ceil.matmul_peak.note:
        return f"the bf16 matmul peak was measured too small to reach this host's rate ({ceil.matmul_peak})"
    return None


def above_ceiling(pct: float, bound: str, ceil: Ceilings) -> str | None:
    """Why a % above 100 is not shown: the case ran faster than the figure called its ceiling, so
    that figure does not bound it (a peak measured at a size below the machine's rate, a stale
    cache entry, timing noise). ``None`` for 100% or less."""
    if pct <= 100.0:
        return None
    fig = ceil.matmul_peak if bound == "compute" else ceil.copy_bandwidth
    name = "bf16 matmul peak" if bound == "compute" else "copy bandwidth"
    return (f"ran at {pct:.0f}% of the {name} ({fig}): that figure does not bound this case, so no % is shown; "
            f"measure the ceiling again (delete the peaks cache, xkernels.peaks.cache_path())")


def band(speedup: float) -> str:
    """The speed band of a speedup over PyTorch."""
    return next(label for low, label in BANDS if speedup >= low)


# -- device ceilings ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Ceilings:
    """Measured copy bandwidth (GB/s) and bf16 matmul peak (TFLOP/s) of a device, plus datasheet."""

    device_name: str
    copy_bandwidth: Figure
    matmul_peak: Figure
    datasheet: dict[str, Figure] = field(default_factory=dict)
    cache_bytes: int | None = None

    @property
    def ridge(self) -> float:
        """FLOP/byte above which a kernel is compute-bound on this device."""
        return self.matmul_peak.value * 1e12 / (self.copy_bandwidth.value * 1e9)


def measure_copy_bandwidth(target: Target, nbytes: int) -> Figure:
    src = torch.empty(nbytes, dtype=torch.uint8, device=target.device).random_()
    dst = torch.empty_like(src)
    t = time_calls(lambda _: dst.copy_(src), [None], target, Settings(warmup=2, min_reps=5, max_reps=30,
                                                                       budget_s=1.0, flush=False))
    return Figure(round(2 * nbytes / (t.median_ms * 1e-3) / 1e9, 1), "GB/s", "measured",
                  f"{nbytes >> 20} MiB device-to-device copy, read + write counted, median of {t.reps}")


#: the GEMM size a host's bf16 peak must be measured at to bound larger GEMMs (below it a cpu's
#: rate still grows with size: 256^3 ran 14x slower than the corpus's GEMMs on a 2-core host)
HOST_PEAK_MIN_N = 2048
LOWER_BOUND_NOTE = "so it bounds no larger GEMM: no compute % is shown against it"


def measure_matmul_peak(target: Target, n: int) -> Figure:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(target.device, torch.bfloat16)
    b = torch.randn(n, n, generator=gen).to(target.device, torch.bfloat16)
    t = time_calls(lambda _: torch.matmul(a, b), [None], target, Settings(warmup=2, min_reps=3, max_reps=30,
                                                                          budget_s=1.0, flush=False))
    return Figure(float(f"{2 * n**3 / (t.median_ms * 1e-3) / 1e12:.4g}"), "TFLOP/s", "measured",
                  f"bf16 {n}x{n}x{n} torch.matmul, median of {t.reps}")


def host_matmul_size(target: Target, seconds: float = 0.05) -> int:
    """The largest of 2048, 1024, 512, 256 whose bf16 matmul takes about ``seconds`` or less on
    this host, from one timed 256^3 call: CPUs without bf16 arithmetic run it hundreds of times
    slower than fp32 (2048^3 took a minute on a 2-core CI-class machine)."""
    a = torch.randn(256, 256).to(target.device, torch.bfloat16)
    torch.matmul(a, a)
    t0 = time.perf_counter()
    torch.matmul(a, a)
    flops_per_s = 2 * 256**3 / max(time.perf_counter() - t0, 1e-9)
    return next((n for n in (2048, 1024, 512) if 2 * n**3 / flops_per_s <= seconds), 256)


def ceilings(target: Target) -> Ceilings:
    """The device's ceilings: from the peaks cache, else measured now and cached."""
    host = target.device.type == "cpu"
    owner = dispatch.backend_for_device_type(target.device.type)  # the device's own backend
    props = owner.properties(target.device)
    copy_bw, peak = props.copy_bandwidth, props.matmul_peak
    if copy_bw is None:
        nbytes = (256 << 20) if host else min(1 << 30, (props.memory_bytes or 8 << 30) // 8)
        copy_bw = measure_copy_bandwidth(target, nbytes)
        peaks.store_figure(owner.name, props.name, "copy_bandwidth", copy_bw)
    if peak is None:
        n = host_matmul_size(target) if host else 8192
        peak = measure_matmul_peak(target, n)
        if host and n < HOST_PEAK_MIN_N:  # not the host's rate: a lower bound, never a ceiling
            peak = Figure(peak.value, peak.unit, peak.source, peak.note + f"; below {HOST_PEAK_MIN_N}^3, "
                          + LOWER_BOUND_NOTE)
        peaks.store_figure(owner.name, props.name, "matmul_peak", peak)
    cache = props.extra.get("l2_bytes") or props.extra.get("llc_bytes")  # accelerator L2, cpu last level
    return Ceilings(props.name, copy_bw, peak, dict(props.datasheet), cache)


# -- one case -----------------------------------------------------------------------------------
def with_grads(inputs: Inputs, seed: int, op: str | None = None) -> tuple[Inputs, tuple[torch.Tensor, ...]]:
    """``inputs`` with every floating tensor a leaf requiring grad (with ``op``: those of
    ``OPS[op].grad_args`` where it names them: rotary's q and k, not its cos / sin tables), and
    random gradients of the results (one per result: a fused norm's y and s, rotary's q_embed
    and k_embed; without ``op``, two of the first argument's shape), for a forward+backward row."""
    gen = torch.Generator().manual_seed(seed)
    picked = OPS[op].grad_args if op is not None else None
    args = tuple(a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                 and (picked is None or i in picked) else a for i, a in enumerate(inputs.args))
    x = inputs.args[0]
    if op is None:
        shapes = [(x.shape, x.dtype)] * 2
    else:
        with torch.no_grad():
            outs = expected_result(op, inputs)
        shapes = [(o.shape, o.dtype) for o in (outs if isinstance(outs, tuple) else (outs,))]
    grads = tuple(torch.randn(shape, generator=gen).to(x.device, dtype) for shape, dtype in shapes)
    return Inputs(args, dict(inputs.kwargs)), grads


def backward_call(fn: Callable[..., Any]) -> Callable[[Any], Any]:
    """A timed forward+backward: ``fn``'s results, then ``torch.autograd.grad`` of them against
    the set's gradients for every input leaf (nothing accumulates into ``.grad``)."""
    def run(pair: Any) -> Any:
        inputs, grads = pair
        outs = fn(*inputs.args, **inputs.kwargs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        leaves = [a for a in inputs.args if isinstance(a, torch.Tensor) and a.requires_grad]
        return torch.autograd.grad(outs, leaves, grads[:len(outs)])
    return run


def bench_case(case: Case, target: Target, ceil: Ceilings, seed: int, settings: Settings = FULL) -> dict[str, Any]:
    """Time ``case`` with xkernels and with PyTorch on the same inputs; one result row. A
    ``case.backward`` row times forward+backward on both sides (``backward_call``)."""
    fn = op_function(case.op)
    torch_fn = OPS[case.op].torch_fn
    first = case.make_inputs(target.device, seed)
    w = work(case.op, first, case.backward)
    cache = ceil.cache_bytes or DEFAULT_CACHE_BYTES
    n_sets = 1 if w.bytes >= cache else min(settings.max_sets, math.ceil(2 * cache / max(w.bytes, 1)))
    sets = [first] + [case.make_inputs(target.device, seed + i) for i in range(1, n_sets)]
    run_xk = lambda s: fn(*s.args, **s.kwargs)  # noqa: E731
    run_torch = lambda s: torch_fn(*s.args, **s.kwargs)  # noqa: E731
    if case.backward:
        sets = [with_grads(s, seed + i, case.op) for i, s in enumerate(sets)]
        first = sets[0]
        run_xk, run_torch = backward_call(fn), backward_call(torch_fn)
    with use_backend(target.backend.name):
        xk = time_calls(run_xk, sets, target, settings, replay=True)
        # after the calls: a first-use check (ops/matmul/evidence.py) may have settled the route
        shown = first[0] if case.backward else first
        expl = fn.explain(*shown.args, **shown.kwargs)
        host = host_time(run_xk, first, target, settings, xk.median_ms) if "small" in case.sizes else None
    th = time_calls(run_torch, sets, target, settings, replay=xk.replayed)  # both sides timed the same way
    if xk.replayed and not th.replayed:
        with use_backend(target.backend.name):
            xk = time_calls(run_xk, sets, target, settings)
    conf = None
    if th.median_ms < xk.median_ms and settings.confirm_rounds:  # a loss is confirmed before it is reported

        def run_xk_here() -> Any:
            with use_backend(target.backend.name):
                return run_xk(first)

        conf = confirm_loss(run_xk_here, lambda: run_torch(first), target, settings, min(xk.median_ms, th.median_ms))
    torch_host = host_time(run_torch, first, target, settings, th.median_ms) if "small" in case.sizes else None
    gbps = w.bytes / (xk.median_ms * 1e-3) / 1e9
    tflops = w.flops / (xk.median_ms * 1e-3) / 1e12
    intensity = w.flops / max(w.bytes, 1)
    # the compute ceiling is the matrix unit's (bf16 matmul) peak, which bounds matmul-like ops
    # only; an element-wise op's ceiling is bandwidth, wherever a host's bf16 peak puts the ridge
    bound = "compute" if OPS[case.op].matmul_like and intensity >= ceil.ridge else "memory"
    misleads = peak_misleads(bound, w.bytes, case.dtype, target, ceil)
    pct = None if misleads else 100 * (tflops / ceil.matmul_peak.value if bound == "compute"
                                       else gbps / ceil.copy_bandwidth.value)
    if pct is not None and (misleads := above_ceiling(pct, bound, ceil)):
        pct = None
    speedup = th.median_ms / xk.median_ms
    return {
        "op": case.op, "dtype": str(case.dtype).removeprefix("torch."), "shape": case.shape_label,
        "layout": case.layout, "device": str(target.device), "backend": target.backend.name,
        "route": expl.route, "variant": expl.variant, "config": dict(expl.config),
        "time_ms": xk.median_ms, "p20_ms": xk.p20_ms, "p80_ms": xk.p80_ms, "reps": xk.reps,
        "torch_time_ms": th.median_ms, "torch_p20_ms": th.p20_ms, "torch_p80_ms": th.p80_ms,
        "speedup": speedup, "band": band(speedup),
        "confirmed": None if conf is None else conf["ratio"], "spread": None if conf is None else conf["spread"],
        "confirm_ms": None if conf is None else conf["ms"], "confirm_rounds": None if conf is None else conf["rounds"],
        "replayed": xk.replayed and th.replayed, "confirm_replayed": None if conf is None else conf["replayed"],
        "confirm_extended": None if conf is None else conf["extended"],
        "explain": expl.why,
        "host_ms": host, "torch_host_ms": torch_host,
        "bytes": w.bytes, "flops": w.flops, "intensity": intensity,
        "gbps": gbps, "tflops": tflops if OPS[case.op].matmul_like else None,
        "bound": bound, "pct_of_peak": pct, "pct_of_peak_omitted": misleads,
        "peak": "copy bandwidth" if bound == "memory" else "bf16 matmul peak",
        "input_sets": n_sets,
    }
