"""A model trained under ``torch.autocast``, patched and not: same dtypes and gradients, and how
fast (``ops/autocast.py``).

Question: most PyTorch training keeps fp32 parameters and runs under
``torch.autocast(dtype=torch.bfloat16)``. Before autocast was handled, a patched model's linear
layers computed in fp32 there (another result dtype, fp32 GEMMs). Now they cast as ``nn.Linear``
does and the blocks run their originals: is the patched step as fast as torch's, and equal?

Per model (zoo name, fp32 parameters): torch's and the patched model's forward + backward under
bf16 autocast; the output dtype and the largest deviation of the output and of the gradients
from torch's; then interleaved rounds (the way switched every round) of ``--steps`` steps each:
wall ms per step (perf_counter around the steps, synchronized) and device ms per step (CUDA events
around them); medians and ranges. ``--json`` writes the rows.

    python tools/probes/autocast_probe.py --models bert-base,vit --json autocast.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch

import xkernels
from xkernels.harness import model_zoo


def _step(model, inputs):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(**inputs)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits
    hidden.float().mean().backward()
    return hidden


def run(name: str, rounds: int, steps: int) -> dict:
    built = model_zoo.build(model_zoo.zoo_config(name, "base"), f"--model {name}", torch.float32,
                            torch.device("cuda"), zoo_name=name, size="base")
    torch_model = built.model
    patched = copy.deepcopy(torch_model)
    report = xkernels.patch(patched)
    row = {"model": name, "tokens": built.tokens, "patch": report.counts()}
    outs, grads = [], []
    for m in (torch_model, patched):
        m.zero_grad(set_to_none=True)
        outs.append(_step(m, built.inputs).detach())
        grads.append([p.grad for p in m.parameters() if p.grad is not None])
    row["dtypes"] = [str(o.dtype) for o in outs]
    row["max_dev_out"] = (outs[1].float() - outs[0].float()).abs().max().item()
    row["max_rel_dev_grad"] = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                                  for a, b in zip(grads[1], grads[0]))
    row["grad_dtypes"] = sorted({str(g.dtype) for g in grads[1]})
    per = {"torch": ([], []), "patch": ([], [])}
    ways = {"torch": torch_model, "patch": patched}
    for m in ways.values():  # warm-up
        for _ in range(3):
            m.zero_grad(set_to_none=True)
            _step(m, built.inputs)
    torch.cuda.synchronize()
    for r in range(rounds):
        for way in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            m = ways[way]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            for _ in range(steps):
                m.zero_grad(set_to_none=True)
                _step(m, built.inputs)
            end.record()
            torch.cuda.synchronize()
            per[way][0].append((time.perf_counter() - t0) * 1e3 / steps)
            per[way][1].append(start.elapsed_time(end) / steps)
    row["ms"] = {w: {"wall": (statistics.median(a), min(a), max(a)), "device": (statistics.median(b), min(b), max(b))}
                 for w, (a, b) in per.items()}
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert-base,vit")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for name in args.models.split(","):
        row = run(name, args.rounds, args.steps)
        rows.append(row)
        t, q = row["ms"]["torch"], row["ms"]["patch"]
        print(f"\n{name} ({row['tokens']} tokens), fp32 parameters, bf16 autocast, training step; "
              f"patch: {row['patch']}")
        print(f"  output dtypes torch / patch {row['dtypes']}, max |dev| {row['max_dev_out']:.3g}, "
              f"grads {row['grad_dtypes']} max rel dev {row['max_rel_dev_grad']:.3g}")
        for kind in ("wall", "device"):
            print(f"  {kind:6s} torch {t[kind][0]:8.3f} ms [{t[kind][1]:.3f}-{t[kind][2]:.3f}]  patch {q[kind][0]:8.3f} ms "
                  f"[{q[kind][1]:.3f}-{q[kind][2]:.3f}]  {t[kind][0] / q[kind][0]:.3f}x")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
