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
around them); medians and ranges. ``--originals`` adds the way ``patch (originals)``: the same
patched model with its blocks running their class's own forwards under autocast (what ``patch()``
did before its blocks fused there), so the blocks' own share is measured in the same rounds.
``--kernels N``: each way's CUDA kernel time per step by torch.profiler (the sum of its kernels,
whatever the host does), and the N kernels whose time differs most from torch's. ``--json``
writes the rows.

    python tools/probes/autocast_probe.py --models bert-base,vit --originals --kernels 12 --json autocast.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import xkernels
from xkernels.harness import model_zoo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_split import kernel_ms  # noqa: E402 - the same profiler sums as the kernel-split probe


def _step(model, inputs):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(**inputs)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits
    hidden.float().mean().backward()
    return hidden


class _Originals:
    """While entered, patch()'s blocks run their class's own forwards under autocast (they take
    ``_is_compiling()`` as the signal to, as while torch.compile traces)."""

    def __enter__(self):
        from xkernels import blocks
        from xkernels.ops.autocast import autocasting

        self.real = blocks._is_compiling
        blocks._is_compiling = lambda: self.real() or autocasting()

    def __exit__(self, *exc):
        from xkernels import blocks

        blocks._is_compiling = self.real


def run(name: str, rounds: int, steps: int, profile: int = 0, originals: bool = False, kernels: int = 0) -> dict:
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
    ways = {"torch": torch_model, "patch": patched}
    if originals:
        ways["patch (originals)"] = patched
    per = {w: ([], []) for w in ways}
    import contextlib

    def context(way):
        return _Originals() if way == "patch (originals)" else contextlib.nullcontext()

    def one(way):
        m = ways[way]
        m.zero_grad(set_to_none=True)
        with context(way):
            _step(m, built.inputs)

    for way in ways:  # warm-up
        for _ in range(3):
            one(way)
    torch.cuda.synchronize()
    for r in range(rounds):
        for way in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            for _ in range(steps):
                one(way)
            end.record()
            torch.cuda.synchronize()
            per[way][0].append((time.perf_counter() - t0) * 1e3 / steps)
            per[way][1].append(start.elapsed_time(end) / steps)
    row["ms"] = {w: {"wall": (statistics.median(a), min(a), max(a)), "device": (statistics.median(b), min(b), max(b))}
                 for w, (a, b) in per.items()}
    if kernels:
        per_kernel = {way: kernel_ms(lambda way=way: one(way), steps) for way in ways}
        row["kernel_ms"] = {way: sum(k.values()) for way, k in per_kernel.items()}
        names = set().union(*per_kernel.values())
        diff = sorted(((per_kernel["patch"].get(n, 0.0) - per_kernel["torch"].get(n, 0.0), n) for n in names),
                      key=lambda d: -abs(d[0]))
        row["kernel_diff"] = [(round(d, 4), n[:110]) for d, n in diff[:kernels]]
    if profile:  # own time per step by function, patch minus torch (cProfile; each step synchronized)
        import cProfile
        import pstats

        own = {}
        for way, m in ways.items():
            prof = cProfile.Profile()
            for _ in range(steps):
                m.zero_grad(set_to_none=True)
                prof.enable()
                with context(way):
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
    p.add_argument("--originals", action="store_true", help="also time the patched model with its blocks running "
                                                               "their originals under autocast")
    p.add_argument("--kernels", type=int, default=0, help="CUDA kernel ms per step per way (torch.profiler) and "
                                                          "this many kernels differing most, patch minus torch")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for name in args.models.split(","):
        row = run(name, args.rounds, args.steps, args.profile, args.originals, args.kernels)
        rows.append(row)
        t = row["ms"]["torch"]
        print(f"\n{name} ({row['tokens']} tokens), fp32 parameters, bf16 autocast, training step; "
              f"patch: {row['patch']}")
        print(f"  output dtypes torch / patch {row['dtypes']}, max |dev| {row['max_dev_out']:.3g}, "
              f"grads {row['grad_dtypes']}, largest relative deviation (2-norm) {row['max_rel_dev_grad']:.3g} "
              f"({row['worst_grad']})")
        for kind in ("wall", "device"):
            for way, q in row["ms"].items():
                if way != "torch":
                    print(f"  {kind:6s} torch {t[kind][0]:8.3f} ms [{t[kind][1]:.3f}-{t[kind][2]:.3f}]  {way} "
                          f"{q[kind][0]:8.3f} ms [{q[kind][1]:.3f}-{q[kind][2]:.3f}]  {t[kind][0] / q[kind][0]:.3f}x")
        if "kernel_ms" in row:
            k = row["kernel_ms"]
            print("  kernels ms per step: " + ", ".join(f"{w} {v:.3f} ({k['torch'] / v:.3f}x)" for w, v in k.items()))
            for d, n in row["kernel_diff"]:
                print(f"  {d:+9.4f} ms  {n}")
        for d, where in row.get("profile", []):
            print(f"  {d:+9.3f} ms  {where}")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
