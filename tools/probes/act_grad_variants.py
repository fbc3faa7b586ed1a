"""Where does the fused input-gradient kernel's time go (``kernels.matmul_tma_act_grad_kernel``)?

At one shape (default BERT's FFN, 8192 x 768 -> 3072, bf16), the kernel with its plan's tiles,
varied one thing at a time: B read (K, N) row-major (the down-projection weight as stored) or
K-major (its transpose copied first, as the forward reads W_up), with and without the
bias-gradient sums, with and without the derivative (a plain GEMM), with the up-projection plan's
launch options or ``feed_forward.resident_options`` (two programs per SM kept resident), against
torch's ``mm + gelu_backward + sum`` and cuBLAS's ``mm`` alone; the compiled kernels' shared memory,
registers and spills. ``do_bench`` medians of interleaved rounds.

    python tools/probes/act_grad_variants.py --json v.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

from xkernels import dispatch
from xkernels.ops import linear
from xkernels.ops.matmul import feed_forward
from xkernels.ops.matmul import kernels as K

aten = torch.ops.aten


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192:768:3072")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    M, D, Fd = (int(v) for v in args.shape.split(":"))
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(M, D, device=dev).to(dt)
    w1 = (torch.randn(Fd, D, device=dev) / D**0.5).to(dt)
    b1 = torch.randn(Fd, device=dev).to(dt)
    w2 = (torch.randn(D, Fd, device=dev) / Fd**0.5).to(dt)
    dy = torch.randn(M, D, device=dev).to(dt)
    h = F.linear(x, w1, b1)
    plan = feed_forward.plan_for(linear, x, w1, b1, w2, None, "gelu", 0.01)
    assert plan is not None
    up = plan.pre.plan
    c = up.constexprs
    bm, bn, bk = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
    shared = {k: c[k] for k in feed_forward._SHARED}
    dh = torch.empty(M, Fd, device=dev, dtype=dt)
    part = torch.empty(-(-M // bm), Fd, device=dev, dtype=torch.float32)
    w2t = w2.t().contiguous()
    meta = {}

    def variant(kmajor, grad, dbias, **opts):
        b = TensorDescriptor(w2t, [Fd, D], [D, 1], [bn, bk]) if kmajor else TensorDescriptor(w2, [D, Fd], [Fd, 1],
                                                                                              [bk, bn])
        descs = (TensorDescriptor(dy, [M, D], [D, 1], [bm, bk]), b,
                 TensorDescriptor(dh, [M, Fd], [Fd, 1], up.tma["c"]), TensorDescriptor(h, [M, Fd], [Fd, 1], up.tma["c"]))
        kw = {**shared, "B_KMAJOR": kmajor, "GRAD": c["ACT"] if grad else 0, "DBIAS": dbias, **up.options, **opts}
        ck = K.matmul_tma_act_grad_kernel[up.grid](*descs, part, M, Fd, D, 0.01, **kw)
        key = (kmajor, grad, dbias, tuple(sorted(opts.items())))
        meta[key] = {"shared": ck.metadata.shared, "regs": ck.n_regs, "spills": ck.n_spills}
        return lambda: K.matmul_tma_act_grad_kernel[up.grid](*descs, part, M, Fd, D, 0.01, **kw)

    resident = feed_forward.resident_options(up, dispatch.select(dev), dev)
    fns = {"torch mm + gelu_backward + sum": lambda: aten.gelu_backward(dy @ w2, h).sum(0),
           "torch mm alone": lambda: dy @ w2,
           "kernel row-major B, plain GEMM": variant(False, False, False),
           "kernel K-major B, plain GEMM": variant(True, False, False),
           "kernel row-major B, grad + dbias, plan options": variant(False, True, True),
           "kernel row-major B, grad, plan options": variant(False, True, False),
           f"kernel row-major B, grad + dbias, {resident} (package)": variant(False, True, True, **resident),
           f"kernel row-major B, grad, {resident}": variant(False, True, False, **resident),
           f"kernel K-major B, grad + dbias, {resident}": variant(True, True, True, **resident),
           "transpose copy of W_down": lambda: w2.t().contiguous()}
    for k in list(fns):
        if "(package)" in k:
            fns["package ActGradPlan (descriptors built per call)"] = lambda: plan.act_grad(dy, w2, h)
    per = {k: [] for k in fns}
    names = list(fns)
    for r in range(args.rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            per[k].append(do_bench(fns[k], warmup=10, rep=60, return_mode="median") * 1e3)
    out = {k: (statistics.median(v), min(v), max(v)) for k, v in per.items()}
    base = out["torch mm + gelu_backward + sum"][0]
    print(f"{torch.cuda.get_device_name()} {args.shape} bf16; up plan: {up.variant}; options {up.options}")
    for k, (med, lo, hi) in out.items():
        print(f"  {k:64s} {med:8.1f} us [{lo:.1f}-{hi:.1f}]  {base / med:.3f}x torch")
    for k, v in meta.items():
        print(f"  compiled (K-major B, grad, dbias, options) = {k}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": args.shape, "us": out, "compiled": {str(k): v for k, v in meta.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
