"""gated_linear's training call (forward + backward) against PyTorch's composition on the gated-MLP
layers of the harness.

    python tools/probes/gated_training_probe.py [--dtype bf16] [--tokens 2048,8192] [--rounds 5] [--device cuda]

Per layer (``xkernels.harness.cases.GATED_LAYERS``) and token count: device time (flush, events,
median over interleaved rounds) of one forward + backward (the gradient of every input, given
an output gradient) of ``reference_gated_linear`` under autograd (what a PyTorch model runs,
and what gated_linear's vendor route recorded before it kept gate and up) and of
``gated_linear`` as its table routes the call; each checked first against PyTorch's gradients
(max |diff| over max |torch|). The prediction tested: the vendor route's training call (the same
GEMMs, gate and up kept, one element-wise kernel in the backward) saves six passes over the
(M, I) intermediate, about 5% of the layer's forward + backward at 2048 tokens.
"""

import argparse
import statistics

import torch

import xkernels
from xkernels.harness import Target
from xkernels.harness.cases import GATED_LAYERS, parse_dtype
from xkernels.harness.perf import Settings, time_calls
from xkernels.ops import gated_linear
from xkernels.ops.fused.gated_linear import reference_gated_linear

S = Settings(warmup=3, warmup_s=0.1, min_reps=10, max_reps=40, budget_s=0.3)
p = argparse.ArgumentParser()
p.add_argument("--dtype", default="bf16")
p.add_argument("--tokens", default="2048,8192")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (the cpu backend runs PyTorch)")
a = p.parse_args()
dtype = parse_dtype(a.dtype)
dev = torch.device(a.device)
target = Target(xkernels.get_backend(dev.type), dev)


def step(fn, leaves, dy):
    for t in leaves:
        t.grad = None
    fn(*leaves).backward(dy)
    return [t.grad for t in leaves]


print("layer tokens torch_ms xkernels_ms speedup spread max-rel-diff route")
for name, h, i, act, concat in GATED_LAYERS:
    w = torch.randn(2 * i, h, device=dev, dtype=dtype) / h**0.5
    weights = (w,) if concat else (w[:i].contiguous(), w[i:].contiguous())
    for m in map(int, a.tokens.split(",")):
        x = torch.randn(m, h, device=dev, dtype=dtype)
        leaves = [t.detach().clone().requires_grad_() for t in (x, *weights)]
        dy = torch.randn(m, i, device=dev, dtype=dtype)
        extra = {"activation": act}
        torch_fn = lambda *t: reference_gated_linear(*t, **extra)  # noqa: E731
        mine_fn = lambda *t: gated_linear(*t, **extra)  # noqa: E731
        want, got = step(torch_fn, leaves, dy), step(mine_fn, leaves, dy)
        diff = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(got, want))
        route = gated_linear.explain(x, *weights, **extra).route
        ratios, t_torch, t_mine = [], [], []
        for _ in range(a.rounds):  # interleaved rounds
            tt = time_calls(lambda _: step(torch_fn, leaves, dy), [None], target, S).median_ms
            tm = time_calls(lambda _: step(mine_fn, leaves, dy), [None], target, S).median_ms
            t_torch.append(tt)
            t_mine.append(tm)
            ratios.append(tt / tm)
        spread = f"[{min(ratios):.3f}-{max(ratios):.3f}]"
        print(f"{name.replace(' ', '')} {m} {statistics.median(t_torch):.4f} {statistics.median(t_mine):.4f} "
              f"{statistics.median(ratios):.3f} {spread} {diff:.1e} {route.replace(' ', '_')}", flush=True)
