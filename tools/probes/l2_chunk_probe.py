"""Can a GEMM + an activation cuBLAS has no epilogue for (erf gelu, silu) beat torch's unfused
pair by running them chunk by chunk, so that the activation reads and rewrites each chunk
while it is still in L2?

Question: torch's ``F.gelu(F.linear(x, W, b))`` at BERT's FFN (8192 x 768 -> 3072, bf16) is
cuBLAS (bias fused) plus one gelu pass over the 50 MB result (~40 us of ~103). H100's L2 is
50 MB and write-back: a chunk of rows written by the GEMM and rewritten in place by the gelu
right after should reach HBM once. Prediction: chunks of 1-2K rows save most of the gelu's HBM
traffic and lose little GEMM efficiency (the chunk GEMMs still fill the SMs), >= 1.1x at 8192
tokens; at small M (one chunk) nothing changes.

Rows: torch unfused (the reference), the GEMM alone, cuBLASLt's fused tanh-GELU (the bound of
an epilogue cuBLAS has), then row chunks and column chunks of R rows / C columns: each chunk
``addmm(..., out=y[chunk])`` then an in-place activation. Results checked against the
reference; ``triton.testing.do_bench`` medians.

    python tools/probes/l2_chunk_probe.py
"""

import torch
import torch.nn.functional as F
from triton.testing import do_bench


def us(fn):
    return do_bench(fn, warmup=25, rep=200) * 1e3


def rows(x, w, b, act_, r):
    y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    wt = w.t()
    for i in range(0, x.shape[0], r):
        c = y[i:i + r]
        torch.addmm(b, x[i:i + r], wt, out=c)
        act_(c)
    return y


def cols(x, w, b, act_, n):
    y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    for j in range(0, w.shape[0], n):
        c = y[:, j:j + n]
        torch.addmm(b[j:j + n], x, w[j:j + n].t(), out=c)
        act_(c)
    return y


def main():
    torch.manual_seed(0)
    acts = {"gelu": (F.gelu, torch.ops.aten.gelu_), "silu": (F.silu, lambda t: F.silu(t, inplace=True))}
    for label, m, k, n, act in (("bert ffn up", 8192, 768, 3072, "gelu"), ("vit ffn up", 12608, 768, 3072, "gelu"),
                                ("bert ffn up 2048 tok", 2048, 768, 3072, "gelu"),
                                ("llama gate 8192 4096->14336 silu", 8192, 4096, 14336, "silu"),
                                ("llama gate 2048 silu", 2048, 4096, 14336, "silu")):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        act, act_ = acts[act]
        ref64 = act(F.linear(x.double(), w.double(), b.double()))
        ref = act(F.linear(x, w, b))
        t_ref = us(lambda: act(F.linear(x, w, b)))
        t_gemm = us(lambda: F.linear(x, w, b))
        line = f"--- {label} ({m}x{k}->{n} + {act}): torch {t_ref:.1f} us, GEMM+bias alone {t_gemm:.1f}"
        if act == "gelu":
            line += f", cuBLASLt tanh-GELU epilogue {us(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)):.1f}"
        print(line, flush=True)
        err_ref = (ref.double() - ref64).abs().max().item()
        for kind, fn, sizes in (("rows", rows, (512, 1024, 2048, 4096)), ("cols", cols, (384, 768, 1536))):
            for s in sizes:
                if (kind == "rows" and s >= m) or (kind == "cols" and s >= n):
                    continue
                got = fn(x, w, b, act_, s)
                err = (got.double() - ref64).abs().max().item()
                t = us(lambda: fn(x, w, b, act_, s))
                print(f"  {kind} of {s}: {t:.1f} us = {t_ref / t:.3f}x torch  (max|err| {err:.3g}, torch's {err_ref:.3g})",
                      flush=True)


if __name__ == "__main__":
    main()
