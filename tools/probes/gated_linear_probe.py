"""gated_linear's routes against torch on the gated-MLP layers of the harness, to seed measured
rules of ``ops/tuning/cuda/gated_linear.json`` (whose catch-all sends everything to the vendor route).

    python tools/probes/gated_linear_probe.py [--dtype bf16] [--tokens 1,16,128,512,2048,8192]

Per layer (``xkernels.harness.cases.GATED_LAYERS``) and token count, device time (flush, events,
median) of: torch's composition (``F.silu(F.linear) * F.linear``, or chunked for Phi-3's
gate_up), the vendor route (``{"VENDOR": true}``: cuBLAS GEMM(s) + the gate kernel), and the
fused kernel under every sm90 candidate of the cuda table; each checked against torch first
(max |diff| relative to max |torch|). The prediction tested: the fused kernel wins where the
GEMMs are bandwidth-bound on the weights (few tokens: x read once, no gate/up round trip), the
vendor route where cuBLAS's GEMM efficiency dominates (thousands of tokens).
"""

import argparse
import json
from pathlib import Path

import torch

import xkernels
from xkernels import tuning
from xkernels.harness import Target
from xkernels.harness.cases import GATED_LAYERS, parse_dtype
from xkernels.harness.perf import Settings, time_calls
from xkernels.ops import gated_linear
from xkernels.ops.fused.gated_linear import reference_gated_linear

S = Settings(warmup=3, warmup_s=0.1, min_reps=10, max_reps=50, budget_s=0.3)
p = argparse.ArgumentParser()
p.add_argument("--dtype", default="bf16")
p.add_argument("--tokens", default="1,16,128,512,2048,8192")
a = p.parse_args()
dtype = parse_dtype(a.dtype)
target = Target(xkernels.get_backend("cuda"), torch.device("cuda"))
table = json.loads((Path(__file__).resolve().parents[2] / "ops/tuning/cuda/gated_linear.json").read_text())
cands = [c for g in table["candidates"]["sm90"] if str(dtype)[6:] in g["when"]["dtype"] for c in g["configs"]]


def ms(fn):
    return time_calls(lambda _: fn(), [None], target, S).median_ms


print("layer tokens route ms speedup-vs-torch max-rel-diff config")
for name, h, i, act, concat in GATED_LAYERS:
    w = torch.randn(2 * i, h, device="cuda", dtype=dtype) / h**0.5
    args_w = (w,) if concat else (w[:i].contiguous(), w[i:].contiguous())
    for m in map(int, a.tokens.split(",")):
        x = torch.randn(m, h, device="cuda", dtype=dtype)
        args = (x, *args_w)
        if act != "silu":
            args += (None,) * (5 - len(args)) + (act,)  # bias, up_bias, activation
        ref = reference_gated_linear(*args)
        t_torch = ms(lambda: reference_gated_linear(*args))
        print(f"{name} {m} torch {t_torch:.4f} 1.00 0 -", flush=True)
        for label, cfg in [("vendor", {"VENDOR": True})] + [("fused", c) for c in cands]:
            try:
                with tuning.force(cfg):
                    got = gated_linear(*args)
                    diff = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                    t = ms(lambda: gated_linear(*args))
                print(f"{name} {m} {label} {t:.4f} {t_torch / t:.2f} {diff:.1e} {json.dumps(cfg)}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a row, not the end
                print(f"{name} {m} {label} failed {type(exc).__name__}: {str(exc).splitlines()[0][:120]} "
                      f"{json.dumps(cfg)}", flush=True)
