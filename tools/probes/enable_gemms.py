"""The GEMMs ``enable()`` routes in one eager step of a zoo model, each timed alone: aten's kernel
against the xkernels route the override would take, with the route ``explain()`` names.

Question: GPT-2 under ``enable()`` ran 0.78-0.80x torch's device time in training
(results/2026-11-25-h100-native-overrides, results/2026-11-27-h200-native-front-door) while
``patch()`` of the same model ran 1.2x. Prediction: the backward's GEMM layouts (a transposed
operand: d(x) = dy @ W, d(W) = dy^T @ x) take Triton routes that lose to cuBLAS, and the forward's
2-D folded calls match patch's 3-D ones.

    python tools/probes/enable_gemms.py [--model gpt2] [--pass forward|step] [--reps 50]

Logs every aten mm / bmm / addmm of one step with a dispatch mode (shapes, strides, dtype), then
per distinct signature: calls per step, aten's device µs, xkernels' route's device µs (the op as
the override calls it: ``matmul(a, b)``, ``linear(a, b.t(), bias)``), the ratio and the route.
Inputs are fresh random numbers of each signature's layout; CUDA-event medians over ``--reps``
calls with the L2 flushed between calls.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--pass", dest="which", choices=["forward", "step"], default="step")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from xkernels.harness import model_zoo
    from xkernels.harness.model_runs import loss_of
    from xkernels.ops import linear, matmul

    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    built = model_zoo.build(model_zoo.zoo_config(args.model, "base"), f"--model {args.model}",
                            getattr(torch, args.dtype), dev, zoo_name=args.model)
    model, inputs = built.model, built.inputs
    wanted = {torch.ops.aten.mm.default: "mm", torch.ops.aten.bmm.default: "bmm", torch.ops.aten.addmm.default: "addmm"}
    seen: collections.Counter = collections.Counter()

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            name = wanted.get(func)
            if name is not None and not kw:
                seen[(name, *((tuple(t.shape), t.stride(), t.dtype) for t in a if isinstance(t, torch.Tensor)),
                      tuple(v for v in a if not isinstance(v, torch.Tensor)))] += 1
            return func(*a, **(kw or {}))

    def step():
        out = model(**inputs)
        if args.which == "step":
            loss_of(out).backward()
            model.zero_grad(set_to_none=True)

    step()
    with Log():
        step()
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(args.reps):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        return statistics.median(times)

    def make(shape, stride, dtype):
        size = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
        return torch.randn(size, device=dev).to(dtype).as_strided(shape, stride)

    total_aten = total_xk = 0.0
    print(f"{args.model} {args.which} {args.dtype}: GEMMs enable() routes, each alone (device us, median of "
          f"{args.reps}, L2 flushed)")
    print(f"{'op':6} {'calls':>5} {'aten us':>9} {'xk us':>9} {'ratio':>6}  operands (shape, strides) -> route")
    for (name, *ops, scalars), n in sorted(seen.items(), key=lambda kv: -kv[1]):
        if scalars and any(v != 1 for v in scalars):
            continue  # beta/alpha != 1: the override sends these to aten
        ts = [make(*o) for o in ops]
        if name == "addmm":
            bias, a, b = ts
            aten = lambda: torch.addmm(bias, a, b)  # noqa: E731
            xk = lambda: linear(a, b.t(), bias)  # noqa: E731
            route = linear.explain(a, b.t(), bias)
        else:
            a, b = ts
            aten = (lambda: torch.mm(a, b)) if name == "mm" else (lambda: torch.bmm(a, b))
            xk = lambda: matmul(a, b)  # noqa: E731
            route = matmul.explain(a, b)
        t_aten, t_xk = timed(aten), timed(xk)
        total_aten += n * t_aten
        total_xk += n * t_xk
        desc = ", ".join(f"{tuple(o[0])}/{tuple(o[1])}" for o in ops)
        how = f"{route.route}" + (f" {route.variant} {route.config}" if route.variant else "")
        print(f"{name:6} {n:5d} {t_aten:9.1f} {t_xk:9.1f} {t_aten / t_xk:6.3f}  {desc} -> {how}")
    print(f"per step: aten {total_aten / 1e3:.3f} ms, xkernels {total_xk / 1e3:.3f} ms, ratio "
          f"{total_aten / max(total_xk, 1e-9):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
