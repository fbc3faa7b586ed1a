"""``python -m xkernels.bench --host``: host µs per call of every documented call form, the
front door's cost.

On cuda: the real calls, the device held busy (``torch.cuda._sleep`` ahead of each timed round,
so the host never waits on it and the wall time is the host's own), next to torch's equivalent.

On the CPU (no accelerator): the Python front door up to the point of launch. The calls run under
``use_backend("interpreter")`` (the kernel backend of cpu tensors: checks, routing, hot entries
as on a GPU) with ``Launcher.__call__`` replaced by a no-op inside this process only, so nothing
is computed (results are uninitialised) and what is timed is xkernels' own host path. The torch
column there is torch computing on the CPU: shown for scale only, not comparable.

Each form: warmed up (its first call plans and leaves its route), then ``--rounds`` rounds of
``--calls`` back-to-back calls, the forms' rounds interleaved with torch's (the order reversed on
odd rounds, so neither side always runs first); reported: the median and the minimum over rounds
of µs per call, and the median over rounds of torch's time over xkernels' in the same round
(``torch/xk``: above 1, xkernels' call costs the host less; a drift of the host's speed meets
both sides of a round). The last rows are whole patched blocks (a BERT output
block, a Llama decoder layer's add+norm steps, a Llama MLP) against torch's modules
(``bench_host_blocks.py``); their full-path column counts the full paths of one forward's op calls.
The ``training:`` rows time a forward and backward per call with gradients required (a linear
layer, with GELU, the BERT output block, ``F.linear`` under ``enabled()``).
The same command before and after a change of the front door, on the same machine, is the
comparison.
"""

from __future__ import annotations

import contextlib
import gc
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

import xkernels
from xkernels import nn as xnn
from xkernels.cli.bench_host_blocks import block_forms, training_forms
from xkernels.ops import add, broadcast, linear, matmul

Form = tuple[str, Callable[[], Any], Callable[[], Any]]
HOLD_CYCLES = 40_000_000  # ~20 ms at 2 GHz: longer than a round's host time


def _dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on a GPU; float32 on the CPU, where torch's bfloat16 GEMMs take milliseconds."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def forms(device: torch.device) -> list[Form]:
    """(label, xkernels call, torch's equivalent) of each documented form; BERT-like sizes."""
    dt = _dtype(device)
    r = lambda *s: torch.randn(*s, device=device, dtype=dt)  # noqa: E731
    x, y, X, b = r(4096), r(4096), r(16, 768), r(768)
    o = torch.empty_like(X)
    a, m = r(16, 768), r(768, 768)
    xl, w, bl = r(16, 768), r(768, 768), r(768)
    lin_t = torch.nn.Linear(768, 768, device=device, dtype=dt)
    lin_x = xnn.Linear.from_linear(lin_t)
    gelu_lin = lambda: F.gelu(F.linear(xl, w, bl))  # noqa: E731
    return [
        ("add(x, y)", lambda: add(x, y), lambda: torch.add(x, y)),
        ("add(x, 2.0)", lambda: add(x, 2.0), lambda: torch.add(x, 2.0)),
        ("add(x, y, alpha=2)", lambda: add(x, y, alpha=2), lambda: torch.add(x, y, alpha=2)),
        ("broadcast(x, b)", lambda: broadcast(X, b), lambda: torch.add(X, b)),
        ("broadcast(x, b, out=o)", lambda: broadcast(X, b, out=o), lambda: torch.add(X, b, out=o)),
        ("matmul(a, b)", lambda: matmul(a, m), lambda: torch.matmul(a, m)),
        ("linear(x, w)", lambda: linear(xl, w), lambda: F.linear(xl, w)),
        ("linear(x, w, b)", lambda: linear(xl, w, bl), lambda: F.linear(xl, w, bl)),
        ('linear(x, w, b, "gelu")', lambda: linear(xl, w, bl, "gelu"), gelu_lin),
        ('linear(x, w, bias=b, activation="gelu")', lambda: linear(xl, w, bias=bl, activation="gelu"), gelu_lin),
        ("nn.Linear module (no_grad)", lambda: lin_x(xl), lambda: lin_t(xl)),
    ]


def routed_forms(device: torch.device) -> list[Form]:
    """Unmodified torch calls; the xkernels side runs them under ``xkernels.enabled()``."""
    dt = _dtype(device)
    r = lambda *s: torch.randn(*s, device=device, dtype=dt)  # noqa: E731
    x, y, a, w, b = r(4096), r(4096), r(16, 768), r(768, 768), r(768)
    return [("enabled(): x + y", lambda: x + y, lambda: x + y),
            ("enabled(): x @ w", lambda: a @ w, lambda: a @ w),
            ("enabled(): F.linear(x, w, b)", lambda: F.linear(a, w, b), lambda: F.linear(a, w, b))]


@contextlib.contextmanager
def stubbed_launch() -> Iterator[None]:
    """Every Triton launch a no-op, in this process, for the block (the CPU mode)."""
    from xkernels.launch import Launcher

    real = Launcher.__call__
    Launcher.__call__ = lambda self, *args: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Launcher.__call__ = real  # type: ignore[method-assign]


def _rounds(fns: list[Callable[[], Any]], calls: int, rounds: int, cuda: bool,
            wrap: list[Callable[[], contextlib.AbstractContextManager[Any]]]) -> list[list[float]]:
    out: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        order = list(zip(fns, out, wrap))
        for fn, times, ctx in order if r % 2 == 0 else order[::-1]:  # neither side always first
            with ctx():
                gc.collect()
                gc.disable()
                try:
                    if cuda:
                        torch.cuda._sleep(HOLD_CYCLES)
                    t = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    times.append((time.perf_counter() - t) / calls * 1e6)
                finally:
                    gc.enable()
                if cuda:
                    torch.cuda.synchronize()
    return out


@contextlib.contextmanager
def counting_full_paths() -> Iterator[list[int]]:
    """Counts the calls that take the op front door's full path (check, route, plan) in the block."""
    from xkernels.ops.op import Op

    real, seen = Op._full_path, [0]

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        return real(self, *args, **kwargs)

    Op._full_path = counted  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        Op._full_path = real  # type: ignore[method-assign]


def measure(device: torch.device, calls: int, rounds: int) -> list[dict[str, Any]]:
    cuda = device.type == "cuda"
    rows = []
    plain = contextlib.nullcontext
    table = [(f, plain) for f in forms(device)] + [(f, xkernels.enabled) for f in routed_forms(device)]
    table += [(f, plain) for f in block_forms(device, _dtype(device))]
    trains = training_forms(device, _dtype(device))
    table += [(f, xkernels.enabled if "enabled()" in f[0] else plain) for f in trains]
    for (label, ours, theirs), ctx in table:
        with contextlib.nullcontext() if label.startswith("training: ") else torch.no_grad():
            with ctx():
                for _ in range(3):
                    ours()  # the first call plans and leaves the route; the next ones repeat
            for _ in range(3):
                theirs()
            mine, torch_times = _rounds([ours, theirs], calls, rounds, cuda, [ctx, plain])
            xkernels.routing_counts(reset=True)
            with counting_full_paths() as full, ctx():
                for _ in range(calls):
                    ours()
            routed = xkernels.routing_counts(reset=True) if ctx is xkernels.enabled else {}
        rows.append({"form": label, "us_median": statistics.median(mine), "us_min": min(mine),
                     "torch_us_median": statistics.median(torch_times), "torch_us_min": min(torch_times),
                     "torch_over_ours": statistics.median(t / m for t, m in zip(torch_times, mine)),
                     "full_path": full[0] / calls,
                     # under enabled(): how the overrides ran those calls (aten op -> route -> calls)
                     "routes": "; ".join(f"{op}: " + ", ".join(f"{why} {n}" for why, n in by.items())
                                         for op, by in routed.items())})
    return rows


def run(device_name: str | None, calls: int, rounds: int) -> int:
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    import triton

    head = (f"xkernels host µs per call, {platform.node()} ({platform.processor() or platform.machine()}), "
            f"python {platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}; "
            f"{rounds} rounds x {calls} calls, median (min) over rounds")
    if device.type == "cuda":
        print(head + f"\ndevice {torch.cuda.get_device_name(device)}: real calls, the device held busy "
              f"(torch.cuda._sleep before each round): the host's own time, next to torch's equivalent")
        ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    elif device.type == "cpu":
        print(head + "\nCPU: the front door to the point of launch: use_backend('interpreter') with "
              "Launcher.__call__ stubbed by a no-op in this process (nothing computed); the torch column "
              "is torch computing on the CPU (one thread), for scale only")
        torch.set_num_threads(1)  # a shared host: torch's CPU GEMMs on one thread, not spinning on all
        ctx = contextlib.ExitStack()
        ctx.enter_context(xkernels.use_backend("interpreter"))
        ctx.enter_context(stubbed_launch())
    else:
        print(f"xkernels.bench --host: device {device} has no host probe (cuda, or cpu with the launch stubbed)")
        return 2
    with ctx:
        rows = measure(device, calls, rounds)
    print(f"{'form':42} {'xkernels us':>16} {'torch us':>16} {'torch/xk':>8}  full paths per call "
          "(0: every repeat hot)  [enabled(): the overrides' routes of the counted calls]")
    for r in rows:
        print(f"{r['form']:42} {r['us_median']:8.2f} ({r['us_min']:5.2f}) "
              f"{r['torch_us_median']:8.2f} ({r['torch_us_min']:5.2f}) {r['torch_over_ours']:7.3f}x  "
              f"{r['full_path']:.2f}" + (f"  [{r['routes']}]" if r["routes"] else ""), flush=True)
    return 0
