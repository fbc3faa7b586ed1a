"""Where a training call's host time goes when its backward is Python: autograd's device thread.

    python tools/probes/backward_handoff.py [--calls 40] [--rounds 9] [--json F]

For each form (bf16, 16 x 768, launch-bound): the fused ``add_layer_norm`` forward + backward, the
same through PyTorch (``x + r``, ``LayerNorm``), PyTorch's with a no-op Python pre-hook on the
LayerNorm's backward node (the bare cost of running any Python on autograd's device thread),
``xkernels.nn.Linear`` and ``nn.Linear``; autograd's multithreading on (PyTorch's default) and off.

Host µs per call are timed with the device held busy (``torch.cuda._sleep``), and each round is
checked: an event recorded right after the sleep kernel must still be pending when the host loop
ends. A round where it is not counted the driver's waits (a full launch queue, a sync) as host
time; it is reported as invalid and left out of the median (``--calls`` small keeps every round
valid).

Then, for the fused op, the call is split by timestamps (``time.perf_counter_ns``): forward; from
``backward()`` to the Python backward's first line (on the device thread when multithreading is
on); the Python backward's body; from its return to ``backward()`` returning. And the body's own
profile on the thread it runs on (cProfile enabled inside the backward).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from xkernels import nn as xnn
from xkernels.backends import native
from xkernels.ops import add_layer_norm
from xkernels.ops.fused import add_norm_grad

HOLD_CYCLES = 200_000_000  # ~100 ms at 2 GHz


def forms(dev: torch.device, dt: torch.dtype, rows: int, n: int) -> list[tuple[str, Callable[[], Any]]]:
    r = lambda *s, g=True: torch.randn(*s, device=dev, dtype=dt).requires_grad_(g)  # noqa: E731
    x, res = r(rows, n), r(rows, n)
    gy, gs = r(rows, n, g=False), r(rows, n, g=False)
    ln = torch.nn.LayerNorm(n, device=dev, dtype=dt)

    def torch_ln() -> None:
        s = x + res
        torch.autograd.backward((ln(s), s), (gy, gs))

    def torch_ln_hook() -> None:
        s = x + res
        y = ln(s)
        y.grad_fn.register_prehook(lambda g: None)
        torch.autograd.backward((y, s), (gy, gs))

    def fused_ln() -> None:
        y, s = add_layer_norm(x, res, ln.weight, ln.bias, ln.eps)
        torch.autograd.backward((y, s), (gy, gs))

    lin_t = torch.nn.Linear(n, n, device=dev, dtype=dt)
    lin_x = xnn.Linear.from_linear(lin_t)
    return [("add_layer_norm fwd+bwd", fused_ln), ("torch add+LayerNorm fwd+bwd", torch_ln),
            ("torch add+LayerNorm, Python pre-hook", torch_ln_hook),
            ("xkernels.nn.Linear fwd+bwd", lambda: lin_x(x).backward(gy)),
            ("nn.Linear fwd+bwd", lambda: lin_t(x).backward(gy))]


def timed(fn: Callable[[], Any], calls: int) -> tuple[float, bool]:
    """(host µs per call, whether the device was still busy when the loop ended)."""
    torch.cuda._sleep(HOLD_CYCLES)
    held = torch.cuda.Event()
    held.record()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t) / calls * 1e6
    valid = not held.query()
    torch.cuda.synchronize()
    return us, valid


class Stamps:
    """Wraps ``AddNormFunction.backward`` to timestamp (and optionally profile) its body."""

    def __init__(self) -> None:
        self.enter: list[int] = []
        self.exit: list[int] = []
        self.threads: set[int] = set()
        self.prof: cProfile.Profile | None = None
        self.real = add_norm_grad.AddNormFunction.backward

    def __enter__(self) -> Stamps:
        real = self.real

        def backward(ctx: Any, *grads: Any) -> Any:
            self.enter.append(time.perf_counter_ns())
            self.threads.add(threading.get_ident())
            if self.prof is not None:
                self.prof.enable()
            try:
                return real(ctx, *grads)
            finally:
                if self.prof is not None:
                    self.prof.disable()
                self.exit.append(time.perf_counter_ns())

        add_norm_grad.AddNormFunction.backward = staticmethod(backward)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        add_norm_grad.AddNormFunction.backward = staticmethod(self.real)  # type: ignore[method-assign]


def segments(dev: torch.device, dt: torch.dtype, rows: int, n: int, calls: int) -> dict[str, Any]:
    r = lambda *s, g=True: torch.randn(*s, device=dev, dtype=dt).requires_grad_(g)  # noqa: E731
    x, res = r(rows, n), r(rows, n)
    gy, gs = r(rows, n, g=False), r(rows, n, g=False)
    ln = torch.nn.LayerNorm(n, device=dev, dtype=dt)
    t0: list[int] = []
    t1: list[int] = []
    t2: list[int] = []
    with Stamps() as st:
        for _ in range(10):
            y, s = add_layer_norm(x, res, ln.weight, ln.bias, ln.eps)
            torch.autograd.backward((y, s), (gy, gs))
        st.enter.clear(), st.exit.clear()
        torch.cuda._sleep(HOLD_CYCLES)
        for _ in range(calls):
            t0.append(time.perf_counter_ns())
            y, s = add_layer_norm(x, res, ln.weight, ln.bias, ln.eps)
            t1.append(time.perf_counter_ns())
            torch.autograd.backward((y, s), (gy, gs))
            t2.append(time.perf_counter_ns())
        torch.cuda.synchronize()
        if not st.enter:  # the native grad_fn (backends/native.cpp): no Python backward to split
            return {"native_grad_fn": y.grad_fn.name(), "body_on_main_thread": None, "body_profile": "",
                    "total_us": statistics.median([c - a for a, c in zip(t0, t2)]) / 1e3}
        med = lambda v: statistics.median(v) / 1e3  # noqa: E731
        out = {"forward_us": med([b - a for a, b in zip(t0, t1)]),
               "to_backward_us": med([e - b for b, e in zip(t1, st.enter)]),
               "backward_body_us": med([x_ - e for e, x_ in zip(st.enter, st.exit)]),
               "from_backward_us": med([c - x_ for x_, c in zip(st.exit, t2)]),
               "total_us": med([c - a for a, c in zip(t0, t2)]),
               "body_on_main_thread": st.threads == {threading.get_ident()}}
        st.prof = cProfile.Profile()
        torch.cuda._sleep(HOLD_CYCLES)
        for _ in range(calls):
            y, s = add_layer_norm(x, res, ln.weight, ln.bias, ln.eps)
            torch.autograd.backward((y, s), (gy, gs))
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(st.prof, stream=text).sort_stats("tottime").print_stats(12)
        out["body_profile"] = text.getvalue()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    native.module(wait=True)
    print(f"native extension: {native.status()}")
    print(f"Python threads: {[t.name for t in threading.enumerate()]}")
    result: dict[str, Any] = {"rows": [], "segments": {}}
    for threads in (True, False):
        torch.autograd.set_multithreading_enabled(threads)
        print(f"\n== autograd multithreading {'on' if threads else 'off'}: host us per call, median [min] "
              f"of the valid rounds of {a.rounds} x {a.calls} calls")
        table = forms(dev, dt, a.rows, a.n)
        for _, fn in table:
            for _ in range(10):
                fn()
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {label: [] for label, _ in table}
        invalid: dict[str, int] = {label: 0 for label, _ in table}
        for i in range(a.rounds):
            order = table if i % 2 == 0 else table[::-1]
            for label, fn in order:
                us, valid = timed(fn, a.calls)
                if valid:
                    times[label].append(us)
                else:
                    invalid[label] += 1
        for label, _ in table:
            v = times[label]
            med = statistics.median(v) if v else float("nan")
            print(f"  {label:40} {med:8.1f} [{min(v) if v else float('nan'):6.1f}]   invalid rounds {invalid[label]}")
            result["rows"].append({"threads": threads, "form": label, "us_median": med,
                                   "us_min": min(v) if v else None, "invalid_rounds": invalid[label]})
        seg = segments(dev, dt, a.rows, a.n, a.calls)
        result["segments"]["on" if threads else "off"] = seg
        if "native_grad_fn" in seg:
            print(f"  fused add_layer_norm: grad_fn {seg['native_grad_fn']} (native), {seg['total_us']:.1f} us per call")
            continue
        print("  fused add_layer_norm split (median us): " + ", ".join(
            f"{k} {v:.1f}" for k, v in seg.items() if k.endswith("_us")) + f"; body on the calling thread: "
              f"{seg['body_on_main_thread']}")
        print(seg["body_profile"])
    torch.autograd.set_multithreading_enabled(True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
