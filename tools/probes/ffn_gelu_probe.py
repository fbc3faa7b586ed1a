"""Can the fused FFN up-projection + gelu beat torch's unfused composition by 10%?

Shapes: BERT-base 768 -> 3072 at 8192 tokens, ViT-B/16 768 -> 3072 at 64 x 197 tokens, bf16.
Rows: torch ``F.gelu(F.linear(x, W, b))`` (the reference), its GEMM alone, cuBLASLt's fused
GELU epilogue (``torch._addmm_activation``: the tanh form, shown only as the vendor's own bound),
xkernels' planned config, then forced TMA configs (tile, stages, warps, persistent, epilogue
subtile). ``triton.testing.do_bench`` medians; each forced result is checked against the
reference before it is timed.

    python tools/probes/ffn_gelu_probe.py
"""

import itertools

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from xkernels import tuning
from xkernels.ops import linear


def us(fn):
    return do_bench(fn, warmup=25, rep=100) * 1e3


def main():
    torch.manual_seed(0)
    for label, m in (("bert 8192", 8192), ("vit 12608", 64 * 197)):
        x = torch.randn(m, 768, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(3072, 768, device="cuda", dtype=torch.bfloat16) / 28
        b = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
        ref = F.gelu(F.linear(x, w, b))
        t_ref = us(lambda: F.gelu(F.linear(x, w, b)))
        print(f"--- {label}: torch F.gelu(F.linear) {t_ref:.1f} us; GEMM alone {us(lambda: F.linear(x, w, b)):.1f} us; "
              f"cuBLASLt gelu(tanh) epilogue {us(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)):.1f} us")
        t = us(lambda: linear(x, w, b, "gelu"))
        print(f"  planned {linear.explain(x, w, b, 'gelu').config}: {t:.1f} us = {t_ref / t:.3f}x")
        results = []
        for (bm, bn), bk, st, wp, pers, sub in itertools.product(
                [(128, 256), (256, 128), (128, 128), (128, 192)], [64], [3, 4, 5], [8], [False, True], [False, True]):
            if bm * bn > 128 * 256 or (bn == 192 and sub):
                continue
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": wp, "num_stages": st,
                   "TMA": True, "PERSISTENT": pers, "EPILOGUE_SUBTILE": sub}
            try:
                with tuning.force(cfg):
                    got = linear(x, w, b, "gelu")
                    err = (got.float() - ref.float()).abs().max().item()
                    t = us(lambda: linear(x, w, b, "gelu"))
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"  {bm}x{bn}x{bk} s{st} w{wp} p{int(pers)} sub{int(sub)}: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:100]}")
                continue
            results.append((t, f"{bm}x{bn}x{bk} s{st} w{wp} p{int(pers)} sub{int(sub)}", err))
        for t, name, err in sorted(results)[:10]:
            print(f"  {name}: {t:.1f} us = {t_ref / t:.3f}x  (max|err| {err:.2g})")


if __name__ == "__main__":
    main()
