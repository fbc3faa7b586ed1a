"""Does Triton's automatic warp specialization (``tl.range(..., warp_specialize=True)``, which
Triton 3.6 runs through its Hopper pass on sm90) make the fused TMA kernel faster?

Question: the fused FFN up-projection + erf gelu stops at ~1.0x torch because the TMA kernel's
GEMM reaches ~65% of cuBLAS (s6 ffn_gelu_probe). Compiled for sm90 on a CPU, warp
specialization only takes effect (setmaxnreg, 12 warps) for 64x128 tiles with 4 warps; larger
tiles either compile unchanged (8 warps) or fail in the pass's data partitioning. Prediction:
if the producer/consumer split pays, the 64x128 WS configs beat the same tiles without it and
the best non-WS configs, at least on the FFN shape.

Rows per shape: torch (the reference, unfused where there is an activation), the planned
xkernels config, then forced configs with and without ``WARP_SPECIALIZE``; each forced result is
checked against the reference before it is timed. ``triton.testing.do_bench`` medians.

    python tools/probes/ws_gemm_probe.py
"""

import itertools

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from xkernels import tuning
from xkernels.ops import linear


def us(fn):
    return do_bench(fn, warmup=25, rep=100) * 1e3


def configs(wide: bool):
    """64x128 with and without WS; ``wide``: also the 128-row tiles without it."""
    tiles = [(64, 128, 4), (128, 128, 8), (128, 256, 8)] if wide else [(64, 128, 4)]
    for (bm, bn, nw), st, pers, sub, ws in itertools.product(tiles, [3, 4], [False, True], [False, True],
                                                             [False, True]):
        if ws and (bm, bn, nw) != (64, 128, 4):
            continue  # the sm90 pass leaves these unchanged or fails (see the module doc)
        yield {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": nw, "num_stages": st,
               "TMA": True, "PERSISTENT": pers, "EPILOGUE_SUBTILE": sub, "WARP_SPECIALIZE": ws}


def main():
    torch.manual_seed(0)
    cases = [("bert ffn up 8192 768->3072 +gelu", 8192, 768, 3072, "gelu"),
             ("bert attn out 8192 768->768", 8192, 768, 768, None),
             ("bert ffn down 8192 3072->768", 8192, 3072, 768, None),
             ("llama o 8192 4096->4096", 8192, 4096, 4096, None)]
    for label, m, k, n, act in cases:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        ref_fn = (lambda: F.gelu(F.linear(x, w, b))) if act else (lambda: F.linear(x, w, b))
        ref = ref_fn()
        t_ref = us(ref_fn)
        t_gemm = us(lambda: F.linear(x, w, b))
        args = (x, w, b, act) if act else (x, w, b)
        t = us(lambda: linear(*args))
        print(f"--- {label}: torch {t_ref:.1f} us (GEMM + bias alone {t_gemm:.1f}); planned "
              f"{linear.explain(*args).config}: {t:.1f} us = {t_ref / t:.3f}x", flush=True)
        rows = []
        for cfg in configs(wide=act is not None):
            name = (f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']} "
                    f"p{int(cfg['PERSISTENT'])} sub{int(cfg['EPILOGUE_SUBTILE'])} ws{int(cfg['WARP_SPECIALIZE'])}")
            try:
                with tuning.force(cfg):
                    got = linear(*args)
                    err = (got.float() - ref.float()).abs().max().item()
                    tt = us(lambda: linear(*args))
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"  {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}", flush=True)
                continue
            rows.append((tt, name, err))
        for tt, name, err in sorted(rows)[:8]:
            print(f"  {name}: {tt:.1f} us = {t_ref / tt:.3f}x torch, {t_gemm / tt:.3f}x its GEMM  (max|err| {err:.2g})")
        ws_rows = [r for r in rows if r[1].endswith("ws1")]
        if ws_rows:
            best = min(ws_rows)
            same = [r for r in rows if r[1] == best[1][:-1] + "0"]
            print(f"  best WS {best[1]}: {best[0]:.1f} us; same config without WS: "
                  f"{same[0][0] if same else float('nan'):.1f} us", flush=True)


if __name__ == "__main__":
    main()
