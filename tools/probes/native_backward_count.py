"""How a patched zoo model's training steps reach the fused add + norm's backward: natively, or
through the Python fallback (which takes the GIL on autograd's thread).

Question: a patched BERT-base training step cost the host 0.90-0.99x torch's on an H100 (switching
way every step, 2026-11-27), most of it inside ``run_backward``. Prediction, if it is the
fallback: after the first steps, every add + norm backward still goes to the Python fallback.

    python tools/probes/native_backward_count.py [--model bert-base] [--steps 5] [--device cuda]

Prints per step the calls of the Python fallback (``add_norm_native._fallback``), of the Python
``AddNormFunction`` (the forward's Python route) and how many native specs hold a backward.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-base")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="base")
    args = ap.parse_args()

    import torch

    import xkernels
    from xkernels.backends import native
    from xkernels.harness import model_zoo
    from xkernels.harness.model_runs import eager_mask_decisions, loss_of
    from xkernels.ops.fused import add_norm_grad, add_norm_native

    native.module(wait=True)
    dev = torch.device(args.device)
    built = model_zoo.build(model_zoo.zoo_config(args.model, args.size), f"--model {args.model}",
                            getattr(torch, args.dtype), dev, zoo_name=args.model, size=args.size)
    model, inputs = built.model, built.inputs
    model.train()
    report = xkernels.patch(model)
    print(str(report).splitlines()[0])
    counts = {"fallback": 0, "python forward": 0}
    real_fallback, real_apply = add_norm_native._fallback, add_norm_grad.AddNormFunction.apply

    def fallback(*a):
        counts["fallback"] += 1
        return real_fallback(*a)

    def apply(*a):
        counts["python forward"] += 1
        return real_apply(*a)

    add_norm_native._fallback = fallback
    add_norm_grad.AddNormFunction.apply = apply
    specs = []
    real_spec = add_norm_native.NativeSide.spec

    def spec(self, eps, offset):
        got = real_spec(self, eps, offset)
        if got is not None and got not in specs:
            specs.append(got)
        return got

    add_norm_native.NativeSide.spec = spec
    for step in range(args.steps):
        counts.update({k: 0 for k in counts})
        with eager_mask_decisions(inputs):
            model.zero_grad(set_to_none=True)
            loss_of(model(**inputs)).backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        print(f"step {step}: {counts}, native specs {len(specs)}, with a backward "
              f"{sum(bool(s.has_backward) for s in specs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
