"""The vendor BLAS with a fused epilogue: ``torch._addmm_activation`` (cuBLASLt's RELU_BIAS /
GELU_BIAS epilogues; its GELU is the tanh approximation, i.e. ``activation="gelu_tanh"``) against
``xkernels.ops.linear`` as it routes today and against torch's unfused ``F.linear`` + activation,
on the linear layers of the real-model corpus and of held-out models, bias present.

Question: cuBLASLt's fused tanh-GELU measured 71 µs for BERT/GPT-2's FFN
up-projection (8192 x 768 -> 3072) against ~98 µs for the Triton kernel and for torch unfused.
Across shapes and token counts, where does the fused vendor call beat both (and so should be a
route for relu / gelu_tanh)? Prediction: from a few hundred tokens up, by 1.2-1.4x over torch
unfused; at one token the vendor falls back to an unfused path (cuBLASLt needs M > 1).

    python tools/probes/vendor_epilogue_probe.py --json out.json [--dtype bfloat16]
    python tools/probes/vendor_epilogue_probe.py --json out.json --no-bias   # layers without a bias

``--no-bias`` (a second question): for layers without a bias (T5's relu FFN, Gemma's
gelu_tanh gate), does the fused call with a zero bias still beat xkernels' route and torch
unfused? Prediction: yes, by the same margins (the bias read is N elements).

Output: results/2026-11-23-h100-vendor-epilogue and -vendor-epilogue-no-bias (the cuda backend's
``vendor_epilogues`` cite them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from xkernels.harness import perf, resolve_target
from xkernels.ops import linear

LAYERS = [(768, 2304), (768, 768), (768, 3072), (3072, 768), (2048, 8192), (4096, 14336), (2048, 16384),
          (1000, 5000)]  # (in, out)
TOKENS = [1, 16, 128, 512, 2048, 8192]
NO_BIAS_LAYERS = [(768, 3072), (1024, 2816), (2048, 16384), (3072, 24576)]  # T5-base wi, T5 v1.1-large, Gemma-2B/7B gate
NO_BIAS_TOKENS = [1, 128, 2048, 8192]


def unfused(x, w, b, act):
    y = F.linear(x, w, b)
    return F.relu(y) if act == "relu" else F.gelu(y, approximate="tanh")


def vendor_fused(x, w, b, act, zero=None):
    return torch._addmm_activation(b if b is not None else zero, x, w.t(), use_gelu=act == "gelu_tanh")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-bias", action="store_true", help="layers without a bias; the fused call gets a zero bias")
    args = ap.parse_args()
    target = resolve_target("cuda", None)
    dtype = getattr(torch, args.dtype)
    settings = perf.Settings(warmup=3, warmup_s=0.05, min_reps=10, max_reps=100, budget_s=0.25)
    rows = []
    for k, n in NO_BIAS_LAYERS if args.no_bias else LAYERS:
        for m in NO_BIAS_TOKENS if args.no_bias else TOKENS:
            for act in ("relu", "gelu_tanh"):
                g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
                sets = []
                n_sets = max(1, min(8, (64 << 20) // max(1, 2 * (m * k + n * k + m * n))))
                for _ in range(n_sets):
                    sets.append((torch.randn(m, k, device="cuda", dtype=dtype, generator=g),
                                 torch.randn(n, k, device="cuda", dtype=dtype, generator=g) / k ** 0.5,
                                 None if args.no_bias else torch.randn(n, device="cuda", dtype=dtype, generator=g)))
                x, w, b = sets[0]
                zero = torch.zeros(n, device="cuda", dtype=dtype)
                ref = unfused(x.double(), w.double(), None if b is None else b.double(), act)
                got = vendor_fused(x, w, b, act, zero)
                err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
                explain = linear.explain(x, w, b, act)
                times = {}
                for name, fn in (("xkernels", lambda s: linear(*s, act)), ("torch_unfused", lambda s: unfused(*s, act)),
                                 ("vendor_fused", lambda s: vendor_fused(*s, act, zero))):
                    times[name] = perf.time_calls(fn, sets, target, settings).median_ms
                row = {"M": m, "K": k, "N": n, "act": act, "dtype": args.dtype, "bias": not args.no_bias,
                       **{f"{k_}_ms": v for k_, v in times.items()},
                       "vendor_vs_torch": times["torch_unfused"] / times["vendor_fused"],
                       "vendor_vs_xkernels": times["xkernels"] / times["vendor_fused"],
                       "xkernels_vs_torch": times["torch_unfused"] / times["xkernels"],
                       "vendor_rel_err": err, "xkernels_route": explain.route}
                rows.append(row)
                print(f"M={m:<5} {k:>5}->{n:<6} {act:9} xk {times['xkernels']*1e3:8.1f} us ({explain.route:13}) "
                      f"torch {times['torch_unfused']*1e3:8.1f}  fused-vendor {times['vendor_fused']*1e3:8.1f}  "
                      f"vendor/torch {row['vendor_vs_torch']:.2f}x  vendor/xk {row['vendor_vs_xkernels']:.2f}x  "
                      f"err {err:.1e}", flush=True)
    summary = {key: statistics.geometric_mean([r[key] for r in rows])
               for key in ("vendor_vs_torch", "vendor_vs_xkernels", "xkernels_vs_torch")}
    print(json.dumps(summary))
    args.json.write_text(json.dumps({"header": {"device": torch.cuda.get_device_name(), "torch": torch.__version__},
                                     "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
