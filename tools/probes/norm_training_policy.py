"""Whole models' eager training step with the LayerNorm blocks' training policy one way or the
other: the fused op recorded by the native grad_fn, or PyTorch's add + LayerNorm.

    python tools/probes/norm_training_policy.py [--models bert-base,vit] [--rounds 11] [--json OUT]

Question: with the native extension (backends/native.cpp) a fused add + LayerNorm training call
costs the host what PyTorch's add and LayerNorm do (tools/probes/backward_handoff.py), so the
policy now fuses (``Backend.native_norm_training_host_ms`` = 0). Does a whole host-bound model's
step gain its device time without losing wall time? Per model, per policy, ``bench --model``'s
eager run of torch and patch (interleaved rounds; the ratios are within each run); the linear
layers' policy stays as shipped. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert-base,vit")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    from xkernels.backends import native
    from xkernels.cli import bench_models
    from xkernels.harness import resolve_target

    native.module(wait=True)
    print(f"native extension: {native.status()}", flush=True)
    target = resolve_target("cuda")
    cls = type(target.backend)
    shipped = (cls.fused_norm_training_host_ms, cls.native_norm_training_host_ms)
    out = []
    for model in args.models.split(","):
        for policy in ("native fused", "PyTorch's ops"):
            if policy == "PyTorch's ops":
                cls.fused_norm_training_host_ms = cls.native_norm_training_host_ms = 1e9
            try:
                rows = bench_models.run(bench_models.zoo_spec(model, "base"), getattr(torch, args.dtype), target,
                                        modes=("eager",), ways=("torch", "patch"), rounds=args.rounds,
                                        log=lambda s: None)
            finally:
                cls.fused_norm_training_host_ms, cls.native_norm_training_host_ms = shipped
            for r in rows:
                r.update(norm_policy=policy)
                if r.get("pass") == "forward+backward":
                    print(f"LayerNorm training {policy:14}: {bench_models.format_row(r)}", flush=True)
            out += rows
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
