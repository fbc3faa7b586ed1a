"""A model trained under ``torch.autocast``, patched and not: same dtypes and gradients, and how
fast (``ops/autocast.py``).

Question: most PyTorch training keeps fp32 parameters and runs under
``torch.autocast(dtype=torch.bfloat16)``. A patched model's linear layers cast there as
``nn.Linear`` does; its add + norm steps fuse on the fp32 residual stream and its gated MLPs cast
their GEMM operands (``xkernels.block_steps.same_math``): is the patched step equal to torch's,
and faster?

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


def run(name: str, rounds: int, steps: int, profile: int = 0) -> dict:
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
    names = [n for n, p in torch_model.named_parameters() if p.grad is not None]
    devs = [((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
            for a, b in zip(grads[1], grads[0])]
    worst = max(range(len(devs)), key=devs.__getitem__)
    row["max_rel_dev_grad"], row["worst_grad"] = devs[worst], names[worst]
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
    if profile:  # own time per step by function, patch minus torch (cProfile; each step synchronized)
        import cProfile
        import pstats

        own = {}
        for way, m in ways.items():
            prof = cProfile.Profile()
            for _ in range(steps):
                m.zero_grad(set_to_none=True)
                prof.enable()
                _step(m, built.inputs)
                prof.disable()
                torch.cuda.synchronize()
            own[way] = {k: v[2] * 1e3 / steps for k, v in pstats.Stats(prof).stats.items()}
        keys = set(own["torch"]) | set(own["patch"])
        diff = sorted(((own["patch"].get(k, 0.0) - own["torch"].get(k, 0.0), k) for k in keys), key=lambda d: -abs(d[0]))
        row["profile"] = [(round(d, 3), f"{k[0].split('/')[-1]}:{k[1]}({k[2]})") for d, k in diff[:profile]]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert-base,vit")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--profile", type=int, default=0, help="print this many functions whose own host time per step "
                                                          "differs most, patch minus torch (cProfile)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for name in args.models.split(","):
        row = run(name, args.rounds, args.steps, args.profile)
        rows.append(row)
        t, q = row["ms"]["torch"], row["ms"]["patch"]
        print(f"\n{name} ({row['tokens']} tokens), fp32 parameters, bf16 autocast, training step; "
              f"patch: {row['patch']}")
        print(f"  output dtypes torch / patch {row['dtypes']}, max |dev| {row['max_dev_out']:.3g}, "
              f"grads {row['grad_dtypes']}, largest relative deviation (2-norm) {row['max_rel_dev_grad']:.3g} "
              f"({row['worst_grad']})")
        for kind in ("wall", "device"):
            print(f"  {kind:6s} torch {t[kind][0]:8.3f} ms [{t[kind][1]:.3f}-{t[kind][2]:.3f}]  patch {q[kind][0]:8.3f} ms "
                  f"[{q[kind][1]:.3f}-{q[kind][2]:.3f}]  {t[kind][0] / q[kind][0]:.3f}x")
        for d, where in row.get("profile", []):
            print(f"  {d:+9.3f} ms  {where}")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
