"""What does a residual add + norm's training step cost under ``torch.compile``, against
xkernels' own add + norm kernels, eager and as the compiled training form?

Question: in compiled BERT-base / ViT training steps (H200, torch 2.11) an ATen ``sum`` of an fp32
[512, 768] ([788, 768] for ViT) takes 0.77 ms per step (6% of BERT's step): Inductor's "mix order
reduction" kernel computes each LayerNorm backward's input gradient and the partial sums of its
weight and bias gradients in one pass, then adds the partials with ``workspace.view(n, N).sum(0)``
in its wrapper, a PyTorch reduction per parameter (two per LayerNorm, 50 per BERT step).
Per norm (``layer``: ``LayerNorm(x + residual)`` with weight and bias; ``rms``: Llama's RMSNorm
of ``x + residual``, its weight) and shape, kernel time per forward + backward (parameters
requiring grad, a fixed random output gradient): PyTorch eager, compiled (Inductor's default, mix
order on), compiled with ``torch._inductor.config.triton.mix_order_reduction`` off,
``xkernels.ops.add_layer_norm`` / ``add_rms_norm`` (eager, its kernels forward and backward) and
the compiled training form (``ops/fused/add_norm_compiled.py``, its table rule bypassed so every
shape takes it: the measurement its rules are written from). Each way's gradients are checked
against float64. Kernel time: torch.profiler, CUDA activity, summed per step; the last line per
shape is compiled (mix order on) over the compiled form.

    python tools/probes/norm_backward_compiled.py --norms layer rms --shapes 8192x768 12608x768

``--dropout P``: ``norm(dropout(x, P) + residual)`` instead (BERT's output blocks in training):
torch's ways apply ``F.dropout`` (Inductor fuses it into its add + norm and the mask into the
backward), the compiled form its own dropout kernels (the measurement of the
``"pass": "compiled_dropout"`` rules). Masks are random, so no way's gradients are checked here
(``tests/ops/fused/test_add_norm_compiled.py`` checks the form's on a known mask).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch._inductor.config
import torch.nn.functional as F

import xkernels
from xkernels.ops.fused import add_norm_compiled


def kernels_ms(step, steps: int) -> tuple[float, list[tuple[float, str]]]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = sorted(((e.self_device_time_total / 1e3 / steps, e.key) for e in prof.key_averages()
                   if e.self_device_time_total > 0), reverse=True)
    return sum(ms for ms, _ in rows), rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--norms", nargs="+", choices=["layer", "rms"], default=["layer"])
    p.add_argument("--shapes", nargs="+", default=["8192x768", "12608x768"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dropout", type=float, default=0.0)
    args = p.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; kernel ms per forward + backward")

    add_norm_compiled.rule = lambda *a: True  # the form for every shape: what its rules are written from
    drop = args.dropout
    if drop:
        print(f"dropout p = {drop} on x before the add (no gradient check: random masks)")

    def dropped(x):
        return F.dropout(x, drop, training=True) if drop else x

    def layer(x, r, w, b):
        return F.layer_norm(dropped(x) + r, (x.shape[-1],), w, b, 1e-12)

    def rms(x, r, w, b):  # Llama's RMSNorm of the sum
        s = (dropped(x) + r).float()
        return w * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    def ours_layer(x, r, w, b):
        return xkernels.ops.add_layer_norm(dropped(x), r, w, b, 1e-12, return_sum=False)

    def ours_rms(x, r, w, b):
        return xkernels.ops.add_rms_norm(dropped(x), r, w, 1e-6, return_sum=False)

    def form_layer(x, r, w, b):
        return add_norm_compiled.add_norm("layer", x, r, w, b, 1e-12, 0.0, False, drop)

    def form_rms(x, r, w, b):
        return add_norm_compiled.add_norm("rms", x, r, w, None, 1e-6, 0.0, False, drop)

    ways = {"layer": (layer, ours_layer, form_layer), "rms": (rms, ours_rms, form_rms)}
    for norm in args.norms:
        eager, ours, form = ways[norm]
        for shape in args.shapes:
            m, n = map(int, shape.split("x"))
            g = torch.Generator(device=dev).manual_seed(m + n)
            x, r, dy = (torch.randn(m, n, device=dev, dtype=dt, generator=g) for _ in range(3))
            w = (1 + 0.1 * torch.randn(n, device=dev, generator=g)).to(dt).requires_grad_()
            b = (0.1 * torch.randn(n, device=dev, generator=g)).to(dt).requires_grad_() if norm == "layer" else None
            x.requires_grad_()
            r.requires_grad_()
            leaves = [t for t in (x, r, w, b) if t is not None]
            ref_in = [t.detach().double().requires_grad_() if t is not None else None for t in (x, r, w, b)]
            eager(*ref_in).backward(dy.double())
            ref = [t.grad for t in ref_in if t is not None]  # (random masks: not compared where drop)
            torch._dynamo.reset()
            mixed = torch.compile(eager)
            mixed(x, r, w, b).backward(dy)  # compiled forward and backward, Inductor's default
            plain = torch.compile(lambda *a, f=eager: f(*a))
            with torch._inductor.config.patch({"triton.mix_order_reduction": False}):
                plain(x, r, w, b).backward(dy)  # the backward compiles at its first call: inside the patch
            formed = torch.compile(form, fullgraph=True)
            times = {}
            for name, fn in (("eager", eager), ("compiled", mixed), ("compiled, mix order off", plain),
                             ("xkernels", ours), ("compiled form", formed)):
                def step(fn=fn):
                    for t in leaves:
                        t.grad = None
                    fn(x, r, w, b).backward(dy)
                for _ in range(3):
                    step()
                errs = [float("nan") if drop else ((t.grad.double() - e).abs().max() / e.abs().max()).item()
                        for t, e in zip(leaves, ref)]
                ms, rows = kernels_ms(step, args.steps)
                times[name] = ms
                print(f"{norm:5s} {shape:>10s}  {name:24s} {ms * 1e3:8.1f} us  rel err "
                      + " ".join(f"{k} {e:.1e}" for k, e in zip(("dx", "dr", "dw", "db"), errs)))
                for k_ms, key in rows[:5]:
                    print(f"                    {k_ms * 1e3:8.1f} us  {key[:100]}")
            print(f"{norm:5s} {shape:>10s}  compiled / compiled form: {times['compiled'] / times['compiled form']:.3f}x")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
