"""Where a patched model's training step loses time: BERT-base 16 x 512 bf16, one forward +
backward, torch eager against ``xkernels.patch(model)``.

Question: the s5 model bench had the patched fwd+bwd at 0.60x torch (40.3 vs 24.3 ms) while the
patched forward's kernels equal torch's. Which GEMMs of the backward (``ops/autograd.py``:
``grad @ W``, ``grad^T @ x``, the gelu pre-activation recompute) lose, and by how much?

Prints: device time per step by kernel name (torch.profiler), wall per step back-to-back, then
every distinct xkernels GEMM signature met in one patched step, with ``explain()``'s route and
config and its time against torch on the same operands (``triton.testing.do_bench`` medians).

    python tools/probes/train_step_probe.py [--model bert-base] [--batch 16] [--seq 512]
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import xkernels
from xkernels.cli import bench_models
from xkernels.ops import autograd as xk_autograd
from xkernels.ops import linear as xk_linear
from xkernels.ops import matmul as xk_matmul


def step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(ids).last_hidden_state.float().square().mean()
    loss.backward()


def wall_ms(model, ids, n=10):
    for _ in range(3):
        step(model, ids)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        step(model, ids)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def device_table(model, ids, label):
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            step(model, ids)
        torch.cuda.synchronize()
    events = prof.key_averages()
    cuda = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time_total for e in cuda) / 2e3
    print(f"--- {label}: device time per step {total:.3f} ms (kernels only), {sum(e.count for e in cuda) // 2} kernels")
    for e in sorted(cuda, key=lambda e: -e.device_time_total)[:18]:
        print(f"  {e.device_time_total / 2e3:8.3f} ms  {e.count // 2:4d}x  {e.key[:100]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-base")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    args = ap.parse_args()
    from triton.testing import do_bench

    dev = torch.device("cuda")
    built = bench_models.build(args.model, "base", args.batch, args.seq, torch.bfloat16, dev, 0)
    model, ids = built.model.train(), built.ids
    print(f"torch eager: {wall_ms(model, ids):.3f} ms per step (back-to-back wall)")
    device_table(model, ids, "torch eager")
    report = xkernels.patch(model)
    print(f"patch: {len(report.replaced)} replaced, {len(report.fused)} fused")
    print(f"patched: {wall_ms(model, ids):.3f} ms per step (back-to-back wall)")
    device_table(model, ids, "patched")

    seen = {}
    real_mm, real_lin = xk_autograd._eager_mm, xk_autograd._eager_lin

    def key(t):
        return (tuple(t.shape), t.stride())

    def spy_mm(a, b):
        seen.setdefault(("matmul", key(a), key(b)), (a.detach(), b.detach(), None))
        return real_mm(a, b)

    def spy_lin(x, w, bias):
        seen.setdefault(("linear", key(x), key(w)), (x.detach(), w.detach(), bias))
        return real_lin(x, w, bias)

    xk_autograd._eager_mm, xk_autograd._eager_lin = spy_mm, spy_lin
    step(model, ids)
    xk_autograd._eager_mm, xk_autograd._eager_lin = real_mm, real_lin
    print(f"--- {len(seen)} distinct GEMM signatures in the patched backward")
    total_x = total_t = 0.0
    for (op, ka, kb), (a, b, bias) in seen.items():
        a = torch.randn_like(a) if a.is_contiguous() else torch.randn_like(a.mT.contiguous()).mT
        b = torch.randn_like(b) if b.is_contiguous() else torch.randn_like(b.mT.contiguous()).mT
        if op == "matmul":
            xk, ref = (lambda: xk_matmul(a, b)), (lambda: torch.matmul(a, b))
            expl = xk_matmul.explain(a, b)
        else:
            xk, ref = (lambda: xk_linear(a, b, bias)), (lambda: torch.nn.functional.linear(a, b, bias))
            expl = xk_linear.explain(a, b, bias)
        with torch.no_grad():
            t_x, t_t = do_bench(xk, rep=50), do_bench(ref, rep=50)
        total_x, total_t = total_x + t_x, total_t + t_t
        cfg = ",".join(f"{k}={v}" for k, v in expl.config.items())
        print(f"{op:6s} a{ka} b{kb}: {t_x * 1e3:7.1f} us vs torch {t_t * 1e3:7.1f} us = {t_t / t_x:4.2f}x  "
              f"[{expl.route}; {expl.variant}; {cfg}; {expl.config_source}]")
    print(f"sum over signatures (once each): xkernels {total_x * 1e3:.0f} us, torch {total_t * 1e3:.0f} us")
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        step(model, ids)
    torch.cuda.synchronize()
    prof.disable()
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(order).print_stats(30)
        print(f"--- patched, host (cProfile, 3 steps, sorted by {order})")
        print(out.getvalue())


if __name__ == "__main__":
    main()
