"""Where the ~5% that interleaved rounds give identical short BLAS calls comes from.

The held-out sets confirmed rows whose route *is* ``torch.matmul`` (about 5 µs calls) at
0.93-0.94x of ``torch.matmul`` (results/2026-11-24-h100-heldout-launch-margin). This probe times,
in ``xkernels.interleave.time_rounds`` as the bench's confirmation does, pairs that differ in one
thing each:

- ``A/A``: ``torch.matmul`` against itself (the position in the round, the allocator);
- ``xk/torch``: ``xkernels.ops.matmul`` against ``torch.matmul`` (the bench's pair);
- ``xk+ctx/torch``: the same inside ``use_backend`` per call (what ``bench_case`` wraps it in);
- ``slow-host/torch``: ``torch.matmul`` behind 30 µs of host spinning (host time leaking into
  device time);
- ``out/torch``: ``torch.matmul`` into a preallocated output (the allocator's block choice);
- each again with a 400 µs hold instead of 100 µs,

and ``graph``: each side captured alone into a CUDA graph and replayed in the same rounds (no
host at all). Per pair: median ratio (side 1 / side 0, >1: side 0 faster) and its p20-p80 over
``--repeat`` runs of ``--rounds`` rounds.

    python tools/probes/timing_bias.py [--rounds 45] [--repeat 5] [--shapes 1500x4608@4608x18432,...]
        [--holds 100,400] [--per-round] [--json OUT]

``--per-round`` prints each round's two times of the first repeat (a loss that comes from a few
rounds, not from the median call). Every pair is also timed with Python's garbage collector off
(``gc-off`` rows), as ``timeit`` times.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch

import xkernels
from xkernels import interleave
from xkernels.dispatch import use_backend

SHAPES = (((1, 768), (768, 3072)), ((56, 7, 7), (56, 7, 128)), ((71, 7, 64), (71, 64, 7)),
          ((333, 4096), (4096, 4096)))


def spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def graphed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=45)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--shapes", help="comma-separated AxB@CxD (batched: BxMxK@BxKxN); default: the four built in")
    ap.add_argument("--holds", default="100,400", help="device hold before each timed call, us (comma-separated)")
    ap.add_argument("--per-round", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    shapes = SHAPES if not args.shapes else tuple(
        tuple(tuple(int(d) for d in side.split("x")) for side in item.split("@")) for item in args.shapes.split(","))
    backend = xkernels.dispatch.backend_for_device_type("cuda")
    dev = torch.device("cuda", 0)
    rows = []
    for sa, sb in shapes:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(sa, generator=gen).to(dev, torch.bfloat16)
        b = torch.randn(sb, generator=gen).to(dev, torch.bfloat16)
        out = torch.matmul(a, b)
        route = str(xkernels.ops.matmul.explain(a, b)).splitlines()[0]

        def in_ctx():
            with use_backend("cuda"):
                return xkernels.ops.matmul(a, b)

        def slow():
            spin(30)
            return torch.matmul(a, b)

        pairs = {"A/A": (lambda: torch.matmul(a, b), lambda: torch.matmul(a, b)),
                 "xk/torch": (lambda: xkernels.ops.matmul(a, b), lambda: torch.matmul(a, b)),
                 "xk+ctx/torch": (in_ctx, lambda: torch.matmul(a, b)),
                 "slow-host/torch": (slow, lambda: torch.matmul(a, b)),
                 "out/torch": (lambda: torch.matmul(a, b, out=out), lambda: torch.matmul(a, b))}
        for hold in (float(h) for h in args.holds.split(",")):
            for name, (f0, f1), gc_off in [(n, p, False) for n, p in pairs.items()] + [
                    ("gc-off " + n, p, True) for n, p in pairs.items() if n in ("A/A", "xk/torch")]:
                rs, ms = [], []
                for k in range(args.repeat):
                    if gc_off:
                        gc.collect()
                        gc.disable()
                    try:
                        t = interleave.time_rounds([f0, f1], backend, dev, args.rounds, hold_us=hold)
                    finally:
                        gc.enable()
                    s = interleave.summary(t)
                    rs.append(s["ratio"])
                    ms.append(s["ms"])
                    if args.per_round and k == 0:
                        print(f"    {name} hold {hold:.0f} rounds (us): "
                              + " ".join(f"{a * 1e3:.0f}/{b * 1e3:.0f}" for a, b in t), flush=True)
                rows.append({"shape": f"{list(sa)}@{list(sb)}", "pair": name, "hold_us": hold, "ratios": rs,
                             "ms": ms, "route": route})
                print(f"{str(list(sa)) + '@' + str(list(sb)):<28} {name:<16} hold {hold:>4.0f}  ratio median "
                      f"{sorted(rs)[len(rs) // 2]:.3f}  runs {' '.join(f'{r:.3f}' for r in rs)}  "
                      f"ms {ms[0][0] * 1e3:.2f}/{ms[0][1] * 1e3:.2f} us", flush=True)
        g_xk = graphed(lambda: xkernels.ops.matmul(a, b))
        g_t = graphed(lambda: torch.matmul(a, b))
        g_t2 = graphed(lambda: torch.matmul(a, b))
        for name, (f0, f1) in {"graph A/A": (g_t, g_t2), "graph xk/torch": (g_xk, g_t)}.items():
            rs = [interleave.summary(interleave.time_rounds([f0, f1], backend, dev, args.rounds))["ratio"]
                  for _ in range(args.repeat)]
            rows.append({"shape": f"{list(sa)}@{list(sb)}", "pair": name, "hold_us": 100.0, "ratios": rs})
            print(f"{str(list(sa)) + '@' + str(list(sb)):<28} {name:<16} hold  100  ratio median "
                  f"{sorted(rs)[len(rs) // 2]:.3f}  runs {' '.join(f'{r:.3f}' for r in rs)}", flush=True)
        print(f"  route: {route}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
