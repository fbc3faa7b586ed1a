"""What encoding a TMA tensor map per launch costs the host, and which route the host probe's
small GEMMs take.

Question: under ``enabled()``, ``x @ w`` (16 x 768 @ 768 x 768, bf16) cost the host ~2 µs more
than torch's ``mm`` in ``bench --host`` (results/2026-11-27-h100-one-linear-node), and
``matmul(a, b)`` ~0.4 µs more. Prediction: these calls launch a TMA kernel from the native
table, whose launch encoded every tensor map per call (``cuTensorMapEncodeTiled``); reusing the
map while its base pointer repeats (``Launch::MapCache``, a weight's always does) removes most of
the difference.

Per form: the route (``explain``), then host µs per call with the device held busy
(``torch.cuda._sleep``), in rounds that alternate the map cache on / off / torch's call, the order
reversed every round: median and min over rounds.

    python tools/probes/tma_map_cache.py [--rounds 9] [--calls 300]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    import xkernels
    from xkernels.backends import native
    from xkernels.ops import linear, matmul

    mod = native.module(wait=True)
    if mod is None or not torch.cuda.is_available():
        print(f"needs a CUDA device and the native extension ({native.unavailable_reason()})")
        return 2
    dev = torch.device("cuda")
    r = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16)  # noqa: E731
    a, m, x, w, b = r(16, 768), r(768, 768), r(16, 768), r(768, 768), r(768)
    forms = [
        ("matmul(a, b)", lambda: matmul(a, m), lambda: torch.matmul(a, m), None),
        ("linear(x, w)", lambda: linear(x, w), lambda: F.linear(x, w), None),
        ("linear(x, w, b)", lambda: linear(x, w, b), lambda: F.linear(x, w, b), None),
        ("enabled(): x @ w", lambda: a @ m, lambda: a @ m, xkernels.enabled),
        ("enabled(): F.linear(x, w, b)", lambda: F.linear(x, w, b), lambda: F.linear(x, w, b), xkernels.enabled),
    ]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}; {args.rounds} rounds x {args.calls} calls")
    print(f"{'form':32} {'route':>60}  {'cache on':>16} {'cache off':>16} {'torch':>16}")
    for label, ours, theirs, ctx in forms:
        import contextlib

        ctx = ctx or contextlib.nullcontext
        with torch.no_grad():
            if "enabled" in label:
                route = "enable(): see routing_counts"
            else:
                route = (matmul.explain(a, m) if label.startswith("matmul") else
                         linear.explain(x, w, b) if "b)" in label else linear.explain(x, w))
                route = " ".join(str(route).split())[:60]
            sides = [(True, ours, ctx), (False, ours, ctx), (None, theirs, contextlib.nullcontext)]
            times: list[list[float]] = [[], [], []]
            for i in range(args.rounds + 1):
                order = list(enumerate(sides))
                for k, (cache, fn, c) in order if i % 2 == 0 else order[::-1]:
                    mod.set_map_cache(cache is not False)
                    with c():
                        for _ in range(3):
                            fn()
                        torch.cuda.synchronize()
                        gc.disable()
                        torch.cuda._sleep(40_000_000)
                        t = time.perf_counter()
                        for _ in range(args.calls):
                            fn()
                        dt = (time.perf_counter() - t) / args.calls * 1e6
                        gc.enable()
                        torch.cuda.synchronize()
                    if i:  # round 0 warms up
                        times[k].append(dt)
            mod.set_map_cache(True)
        cells = [f"{statistics.median(t):7.2f} ({min(t):6.2f})" for t in times]
        print(f"{label:32} {route:>60}  {cells[0]:>16} {cells[1]:>16} {cells[2]:>16}", flush=True)
    with xkernels.enabled():
        xkernels.routing_counts(reset=True)
        a @ m
        F.linear(x, w, b)
        print("enable() routes of the last two forms:", xkernels.routing_counts())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
