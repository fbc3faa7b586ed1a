"""Host µs per training call (forward + backward) of the paths a patched model takes, next to
torch's, with the device held busy, and where xkernels' time goes.

    python tools/probes/training_host.py [--calls 200] [--rounds 7] [--profile 30] [--json F]
                                         [--single-thread]

Forms (bf16 on cuda; BERT-base's 768 features on 16 tokens, so every call is launch-bound):
``add_layer_norm`` / ``add_rms_norm`` forward + backward against ``x + r`` then PyTorch's
LayerNorm / Llama's RMSNorm forward + backward; ``xkernels.nn.Linear`` (plain, and gelu) against
``nn.Linear`` (+ ``F.gelu``); a patched BERT output block against torch's. Each timed round holds
the device with ``torch.cuda._sleep`` first, so the wall time is the host's own; rounds of the
two sides alternate; reported: median and minimum µs per call over rounds.

``--profile N`` prints the top N functions (own time) of each xkernels form over the timed calls,
with autograd's multithreading off (``torch.autograd.set_multithreading_enabled(False)``: the
backward then runs on the calling thread, where cProfile sees it; the timed rounds keep it on).
``--single-thread`` turns it off for the timed rounds too: against a run without it, what the
backward's hand-off to autograd's device thread costs each side (a Python ``autograd.Function``'s
backward takes the GIL there). Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import xkernels
from xkernels import nn as xnn
from xkernels.cli.bench_host_blocks import RMSNorm
from xkernels.ops import add_layer_norm, add_rms_norm

HOLD = 60_000_000


def forms(dev: torch.device, dt: torch.dtype, rows: int, n: int) -> list[tuple[str, Callable[[], Any],
                                                                             Callable[[], Any]]]:
    r = lambda *s, g=True: torch.randn(*s, device=dev, dtype=dt).requires_grad_(g)  # noqa: E731
    x, res = r(rows, n), r(rows, n)
    gy, gs = r(rows, n, g=False), r(rows, n, g=False)
    ln = torch.nn.LayerNorm(n, device=dev, dtype=dt)
    rms = RMSNorm(n).to(dev, dt)

    def t_ln() -> Any:
        s = x + res
        y = ln(s)
        torch.autograd.backward((y, s), (gy, gs))

    def x_ln() -> Any:
        y, s = add_layer_norm(x, res, ln.weight, ln.bias, ln.eps)
        torch.autograd.backward((y, s), (gy, gs))

    def t_rms() -> Any:
        s = x + res
        y = rms(s)
        torch.autograd.backward((y, s), (gy, gs))

    def x_rms() -> Any:
        y, s = add_rms_norm(x, res, rms.weight, rms.variance_epsilon)
        torch.autograd.backward((y, s), (gy, gs))

    lin_t = torch.nn.Linear(n, n, device=dev, dtype=dt)
    lin_x = xnn.Linear.from_linear(lin_t)
    up_t = torch.nn.Linear(n, 4 * n, device=dev, dtype=dt)
    up_x = xnn.Linear.from_linear(up_t, "gelu")
    g4 = torch.randn(rows, 4 * n, device=dev, dtype=dt)
    return [
        ("add_layer_norm fwd+bwd", x_ln, t_ln),
        ("add_rms_norm fwd+bwd", x_rms, t_rms),
        ("nn.Linear fwd+bwd", lambda: lin_x(x).backward(gy), lambda: lin_t(x).backward(gy)),
        ("nn.Linear+gelu fwd+bwd", lambda: up_x(x).backward(g4), lambda: F.gelu(up_t(x)).backward(g4)),
        ("nn.Linear fwd (grad)", lambda: lin_x(x), lambda: lin_t(x)),
        ("add_layer_norm fwd (grad)", lambda: add_layer_norm(x, res, ln.weight, ln.bias, ln.eps),
         lambda: ln(x + res)),
    ]


def timed(fn: Callable[[], Any], calls: int) -> float:
    torch.cuda._sleep(HOLD)
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return us


def profile(fn: Callable[[], Any], calls: int, top: int) -> str:
    torch.autograd.set_multithreading_enabled(False)
    prof = cProfile.Profile()
    try:
        torch.cuda._sleep(HOLD)
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
    finally:
        torch.autograd.set_multithreading_enabled(True)
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--single-thread", action="store_true", help="autograd's multithreading off for the timed rounds")
    a = ap.parse_args()
    dev = torch.device("cuda")
    if a.single_thread:
        torch.autograd.set_multithreading_enabled(False)
    rows = []
    print(f"{'form':28} {'xkernels us':>12} {'torch us':>9} {'x/torch':>8}   (median [min] of {a.rounds} rounds)")
    for label, xk, tc in forms(dev, torch.bfloat16, a.rows, a.n):
        for _ in range(20):
            xk(), tc()
        torch.cuda.synchronize()
        tx: list[float] = []
        tt: list[float] = []
        for i in range(a.rounds):
            pair = ((xk, tx), (tc, tt)) if i % 2 == 0 else ((tc, tt), (xk, tx))
            for fn, acc in pair:
                acc.append(timed(fn, a.calls))
        mx, mt = statistics.median(tx), statistics.median(tt)
        rows.append({"form": label, "xkernels_us": mx, "torch_us": mt, "xkernels_min": min(tx), "torch_min": min(tt)})
        print(f"{label:28} {mx:8.1f} [{min(tx):5.1f}] {mt:6.1f} [{min(tt):5.1f}] {mx / mt:6.2f}x", flush=True)
    if a.profile:
        for label, xk, _ in forms(dev, torch.bfloat16, a.rows, a.n):
            for _ in range(20):
                xk()
            print(f"--- {label}: top {a.profile} by own time, {a.calls} calls")
            print(profile(xk, a.calls, a.profile), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"xkernels": xkernels.__version__ if hasattr(xkernels, "__version__") else None,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
