"""Where does linear's time go at 4096^3? Each variant timed alone (flush, events, median).

    python tools/probes/linear_probe.py [--configs]

Rows: torch's pieces (matmul, F.linear with bias, + gelu) and xkernels' linear with and without
the epilogue, on weight.T (K-contiguous B, linear's layout) and on a row-major copy of it
(matmul's layout), so the layout cost and the epilogue cost show separately. ``--configs`` also
times linear (bias + gelu) under a few forced configs.
"""

import sys

import torch
import torch.nn.functional as F

import xkernels
from xkernels import tuning
from xkernels.harness import Target
from xkernels.harness.perf import Settings, time_calls
from xkernels.ops import linear, matmul

S = Settings(warmup=3, warmup_s=0.1, min_reps=20, max_reps=100, budget_s=0.4)
target = Target(xkernels.get_backend("cuda"), torch.device("cuda"))


def ms(fn):
    return time_calls(lambda _: fn(), [None], target, S).median_ms


for dtype in (torch.bfloat16, torch.float16):
    n = 4096
    x = torch.randn(n, n, device="cuda").to(dtype)
    w = torch.randn(n, n, device="cuda").to(dtype) / 64
    b = torch.randn(n, device="cuda").to(dtype)
    wt = w.t().contiguous()  # (K, N) row-major: matmul's layout
    rows = {
        "torch x @ W.T": lambda: x @ w.t(),
        "torch F.linear(x, W, b)": lambda: F.linear(x, w, b),
        "torch F.linear + gelu (the reference)": lambda: F.gelu(F.linear(x, w, b)),
        "xk linear(x, W)": lambda: linear(x, w),
        "xk linear(x, W, b)": lambda: linear(x, w, b),
        "xk linear(x, W, b, gelu)": lambda: linear(x, w, b, "gelu"),
        "xk matmul(x, W.T view)": lambda: matmul(x, w.t()),
        "xk matmul(x, W.T contiguous)": lambda: matmul(x, wt),
    }
    ref = F.gelu(F.linear(x.double(), w.double(), b.double()))
    err = (linear(x, w, b, "gelu").double() - ref).abs().max().item()
    print(f"{dtype}: max |linear - float64 ref| = {err:.3g}; config {linear.explain(x, w, b, 'gelu').config}")
    base = None
    for name, fn in rows.items():
        t = ms(fn)
        base = t if base is None else base
        print(f"  {name:40s} {t:8.4f} ms  {2 * n**3 / t / 1e9:7.1f} TFLOP/s")
    if "--configs" in sys.argv:
        ref_ms = ms(rows["torch F.linear + gelu (the reference)"])
        for m_, n_, k_, wps, st in [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3),
                                    (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (128, 256, 32, 8, 4),
                                    (128, 128, 128, 8, 3), (64, 256, 64, 4, 4)]:
            cfg = {"BLOCK_M": m_, "BLOCK_N": n_, "BLOCK_K": k_, "GROUP_M": 8, "num_warps": wps, "num_stages": st}
            with tuning.force(cfg):
                try:
                    t = ms(lambda: linear(x, w, b, "gelu"))
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"  forced {cfg}: {type(exc).__name__}")
                    continue
            print(f"  forced {m_}x{n_}x{k_} w{wps} s{st}: {t:.4f} ms = {ref_ms / t:.2f}x the reference")
