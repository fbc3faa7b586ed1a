"""Held-out GEMMs: ``ops.linear`` against ``F.linear`` (+ activation) on layers of models that are
not in the real-model corpus (``xkernels/harness/models.json``), at token counts the corpus does
not list, with the bench's timer (``perf.bench_case``: torch in the same run, medians).

Question: do the tables' rules and the wave-model fallback generalise to shapes nobody tuned on?
Prediction: no held-out shape below 0.9x torch (a class where every kernel loses is routed to
the vendor BLAS; a shape between measured classes gets a neighbour's or the model's config).

    python tools/probes/unseen_gemms.py --json unseen.json [--dtype bfloat16] [--models clip-vit-b16,minitron-8b]

Caveat printed with the results: the calibration runs the cuda tables were built from
(results/2026-11-22-h100-gemm-calibration, -seeds) contain a few of these (N, K) at other token counts
(3000x1000->5000 and 50257x768 among them); the "seen (N,K)" column says which.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from xkernels.harness import perf, resolve_target
from xkernels.harness.cases import Case, T, parse_dtype

# (model, layer, in, out, activation, bias): public configs (Hugging Face config.json of each model)
LAYERS = [
    ("qwen2.5-7b", "qkv", 3584, 4608, None, True),
    ("qwen2.5-7b", "o", 3584, 3584, None, False),
    ("qwen2.5-7b", "up", 3584, 18944, None, False),
    ("qwen2.5-7b", "down", 18944, 3584, None, False),
    ("phi-3-mini", "qkv", 3072, 9216, None, False),
    ("phi-3-mini", "o", 3072, 3072, None, False),
    ("phi-3-mini", "down", 8192, 3072, None, False),
    ("opt-1.3b", "qkv", 2048, 6144, None, True),
    ("opt-1.3b", "fc1", 2048, 8192, "relu", True),
    ("opt-1.3b", "fc2", 8192, 2048, None, True),
    ("gemma-2b", "qkv", 2048, 2560, None, False),
    ("gemma-2b", "gate", 2048, 16384, "gelu_tanh", False),
    ("gemma-2b", "down", 16384, 2048, None, False),
    ("mlp-3000", "fc", 1000, 5000, None, True),
    ("clip-vit-b16", "fc1", 768, 3072, "quick_gelu", True),
    ("clip-vit-l14", "fc1", 1024, 4096, "quick_gelu", True),
    ("minitron-8b", "up", 4096, 16384, "relu2", False),
    ("persimmon-8b", "fc1", 4096, 16384, "relu2", True),
]
TOKENS = [1, 77, 1000, 4000]
SEEN_NK = {(5000, 1000), (50257, 768), (11008, 2048), (13824, 5120)}  # in the calibration runs


def cases(dtype: torch.dtype, models: set[str] | None = None) -> list[tuple[str, Case]]:
    out = []
    for model, layer, k, n, act, bias in LAYERS:
        if models and model not in models:
            continue
        for m in TOKENS:
            args = (T((m, k), dtype), T((n, k), dtype), T((n,), dtype) if bias else None) + ((act,) if act else ())
            # up to 77 tokens also the wall time per back-to-back call (the bench's host column):
            # where a call is launch-bound, the device time alone does not decide
            sizes = frozenset({"held-out", "small"} if m <= 77 else {"held-out"})
            out.append((f"{model}.{layer}", Case("linear", args, f"{model}.{layer}", sizes)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--models", default="", help="comma-separated model names of LAYERS to run (default: all)")
    args = ap.parse_args()
    models = {m for m in args.models.split(",") if m}
    unknown = models - {layer[0] for layer in LAYERS}
    if unknown:
        ap.error(f"--models: unknown {sorted(unknown)}; known: {sorted({layer[0] for layer in LAYERS})}")
    target = resolve_target(args.device, None)
    ceil = perf.ceilings(target)
    rows = []
    for dt in args.dtype.split(","):
        for label, case in cases(parse_dtype(dt), models):
            row = perf.bench_case(case, target, ceil, seed=0)
            m, k = case.args[0].shape
            n = case.args[1].shape[0]
            row.update(model_layer=label, M=m, N=n, K=k, seen_nk=(n, k) in SEEN_NK)
            rows.append(row)
            wall = (f"  wall/call {row['host_ms'] * 1e3:.1f} vs {row['torch_host_ms'] * 1e3:.1f} us"
                    if row.get("host_ms") else "")
            print(f"{dt:9} {label:18} M={m:<5} {k}->{n:<6} {row['speedup']:.2f}x  route={row['route']}{wall}",
                  flush=True)
    ratios = [r["speedup"] for r in rows]
    unseen = [r["speedup"] for r in rows if not r["seen_nk"]]
    summary = {"geomean": statistics.geometric_mean(ratios), "worst": min(ratios), "n": len(ratios),
               "geomean_unseen_nk": statistics.geometric_mean(unseen) if unseen else None,
               "worst_unseen_nk": min(unseen) if unseen else None,
               "below_0.9": sum(x < 0.9 for x in ratios)}
    print(json.dumps(summary))
    args.json.write_text(json.dumps({"header": {"device": torch.cuda.get_device_name() if torch.cuda.is_available()
                                                else str(target.device), "torch": torch.__version__},
                                     "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
