"""A whole model's eager training step, torch and patched, with autograd's multithreading on and
off, and the training policies as shipped or forced to xkernels' fused ops.

Question: one training call of the fused add + LayerNorm costs the host 491 us against torch's
272 us on an H100 with autograd's multithreading on (the default: the backward runs on autograd's
device thread), but 250 against 215 us with it off (``training_host.py --single-thread``,
results/2026-11-25-h100-training-threads). Does that carry over to a whole model's step, where one
``backward()`` runs every block: does turning it off make the fused blocks pay on the wall, and
what does it do to torch's own step? Prediction: torch's step gains a little host time; the
patched step with the fused ops forced gains much more, enough to beat torch's wall.

    python tools/probes/training_threads.py [--model bert-base] [--rounds 5] [--json OUT]

Four configurations in turn, each ``bench --model``'s eager run of the ways torch and patch
(interleaved rounds, medians; forward+backward rows printed): threads on / off (thread-local
``torch.autograd.set_multithreading_enabled``) x policies shipped / fused (the backend's
``fused_norm_training_host_ms`` and ``linear_training_host_ms`` set to 0: every training call
through xkernels).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-base")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="base")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    import xkernels.nn
    from xkernels.backends import native

    native.module(wait=True)
    from xkernels.cli import bench_models
    from xkernels.harness import resolve_target

    target = resolve_target(args.device)
    cls = type(target.backend)
    shipped = (cls.fused_norm_training_host_ms, cls.linear_training_host_ms)
    out = []
    for threads in (True, False):
        for policy in ("shipped", "fused"):
            cls.fused_norm_training_host_ms, cls.linear_training_host_ms = shipped if policy == "shipped" else (0.0, 0.0)
            xkernels.nn._paying.clear()
            torch.autograd.set_multithreading_enabled(threads)
            try:
                rows = bench_models.run(bench_models.zoo_spec(args.model, args.size), getattr(torch, args.dtype),
                                        target, modes=("eager",), ways=("torch", "patch"), rounds=args.rounds,
                                        log=lambda s: None)
            finally:
                torch.autograd.set_multithreading_enabled(True)
                cls.fused_norm_training_host_ms, cls.linear_training_host_ms = shipped
            label = f"threads {'on ' if threads else 'off'} policies {policy}"
            for r in rows:
                r.update(threads=threads, policy=policy)
                if r.get("pass") == "forward+backward":
                    print(f"{label}: {bench_models.format_row(r)}", flush=True)
            out += rows
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
