"""Where a patched model's device time goes against torch's: CUDA kernel time per pass by kernel.

Question: ``bench --model`` gives a whole model's device time; when the patched model's ratio is
large (ModernBERT-base forward 2.33x on an H200, results/2026-11-29-h200-gated-forms-whole-models)
or small, which kernels make it? Per way (torch, patch): the output checked against torch's
(max |dev|), warm-up passes, then ``--steps`` passes under torch.profiler (CUDA activity only):
kernel ms per pass by kernel name, summed into groups (GEMM, attention, Triton kernels,
reduction, copy, element-wise), and the ``--top`` kernels whose time differs most
between the ways. ``--json`` writes the rows.

    python tools/probes/kernel_split.py --model-config tools/probes/data/modernbert-base.json --batch 16 --seq 512
    python tools/probes/kernel_split.py --model llama --pass step
    python tools/probes/kernel_split.py --model bert-base --pass step --compile
    python tools/probes/kernel_split.py --model bert-base --pass step --compile --ops 12

``--ops N`` adds, for the N kernels taking the most time in each way, the operators that launched
them (the innermost operator around the launch and its parents) with their input shapes, from a
second profile that records CPU operators and shapes: which op a generic kernel name belongs to.
``--dropout P`` sets every ``nn.Dropout`` module's probability to P and trains in train mode
(fine-tuning's hidden dropout; the model zoo builds with every random part off): the outputs of
the ways then differ by their masks, so their deviation says nothing. ``--masks eager`` runs
each call under ``harness.model_runs.eager_mask_decisions`` (transformers' attention masks decided
as in eager mode, as ``bench --mode compile`` decides them for every way: like for like); the
default is what a user's own compiled model runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

import torch

import xkernels
from xkernels.harness import model_runs, model_zoo


def group(name: str) -> str:
    """The kernel's group: GEMM, attention, Triton (a plain function name: xkernels' kernels, or
    any other Triton kernel), reduction, copy or element-wise (PyTorch's other kernels)."""
    if name.startswith(("nvjet", "cutlass", "sm90_xmma")) or "gemm" in name.lower() or "cublas" in name:
        return "GEMM"
    if any(k in name for k in ("sdpa", "flash", "fmha")):
        return "attention"
    if name.startswith(("Memset", "Memcpy")):
        return "copy"
    if "::" not in name and "<" not in name and "(" not in name:
        return "Triton"
    if any(k in name for k in ("reduce", "norm", "GammaBeta", "softmax")):
        return "reduction"
    if any(k in name for k in ("copy", "CatArray", "index", "gather", "scatter")):
        return "copy"
    return "element-wise"


def kernel_ms(call, steps: int) -> dict[str, float]:
    """CUDA kernel ms per call of ``call`` by kernel name (torch.profiler), over ``steps`` calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        ms = getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) / 1e3 / steps
        if ms > 0:
            out[e.key] = out.get(e.key, 0.0) + ms
    return out


def launching_ops(call, steps: int, top: int) -> list[dict]:
    """The ``top`` kernels by time over ``steps`` calls of ``call``, each with the operators that
    launched it: (the innermost operator's name, its parents' names, its input shapes) and the
    kernel ms per call launched under each (torch.profiler with CPU activity and shapes)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
    by_kernel: dict[str, dict[str, float]] = {}
    for e in prof.events():
        kernels = getattr(e, "kernels", None) or []
        if not kernels:
            continue
        op, chain = e, []
        while op is not None and op.name.startswith("cu") and getattr(op, "cpu_parent", None) is not None:
            op = op.cpu_parent
        parent = op
        while parent is not None and len(chain) < 4:
            chain.append(parent.name[:60])
            parent = getattr(parent, "cpu_parent", None)
        where = f"{' < '.join(chain)} {getattr(op, 'input_shapes', '')}"[:300]
        for k in kernels:
            ms = getattr(k, "duration", 0) / 1e3 / steps
            by_kernel.setdefault(k.name, {})
            by_kernel[k.name][where] = by_kernel[k.name].get(where, 0.0) + ms
    rows = sorted(({"kernel": n, "ms": sum(w.values()), "ops": dict(sorted(w.items(), key=lambda i: -i[1])[:4])}
                   for n, w in by_kernel.items()), key=lambda r: -r["ms"])
    return rows[:top]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a built-in model (bert-base, gpt2, llama, vit)")
    p.add_argument("--model-config", default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--pass", dest="which", choices=("forward", "step"), default="forward")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=16)
    p.add_argument("--compile", action="store_true", help="both ways under torch.compile (default mode)")
    p.add_argument("--ops", type=int, default=0, help="name the operators that launched the N longest kernels")
    p.add_argument("--dropout", type=float, default=0.0, help="every nn.Dropout's p (train mode)")
    p.add_argument("--masks", choices=("traced", "eager"), default="traced",
                   help="eager: transformers' masks decided as in eager mode (bench --mode compile's default)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if (args.model is None) == (args.model_config is None):
        p.error("give one of --model, --model-config")
    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda")
    if args.model:
        data, source, zoo = model_zoo.zoo_config(args.model, "base"), f"--model {args.model}", args.model
    else:
        data, source, zoo = model_zoo.read_config(args.model_config), f"--model-config {args.model_config}", None
    built = model_zoo.build(data, source, dtype, device, args.batch, args.seq, args.layers, zoo_name=zoo)
    if args.dropout:
        for m in built.model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = args.dropout
        built.model.train()
    ways = {"torch": built.model, "patch": copy.deepcopy(built.model)}
    report = xkernels.patch(ways["patch"])
    if args.compile:
        ways = {w: torch.compile(m) for w, m in ways.items()}
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; {source}, {built.tokens} tokens, "
          f"{args.dtype}, {args.which}{' compiled' if args.compile else ''}"
          f"{f', dropout {args.dropout}' if args.dropout else ''}, {args.masks} masks; patch: {report.counts()}")

    def run(m):
        if args.masks == "eager":
            with model_runs.eager_mask_decisions(built.inputs):
                return plain_run(m)
        return plain_run(m)

    def plain_run(m):
        if args.which == "forward":
            with torch.no_grad():
                return m(**built.inputs)
        m.zero_grad(set_to_none=True)
        out = m(**built.inputs)
        first = out[0] if isinstance(out, tuple) else next(iter(out.values()))
        first.float().mean().backward()
        return out

    def main_output(out):
        return out[0] if isinstance(out, tuple) else next(iter(out.values()))

    outs = {w: main_output(run(m)).detach().float() for w, m in ways.items()}
    dev = (outs["patch"] - outs["torch"]).abs().max().item()
    print(f"output {tuple(outs['torch'].shape)}: max |dev| patch against torch {dev:.4g} "
          f"(max |torch| {outs['torch'].abs().max().item():.4g})")
    for m in ways.values():
        for _ in range(3):
            run(m)
    torch.cuda.synchronize()
    per = {w: kernel_ms(lambda m=m: run(m), args.steps) for w, m in ways.items()}
    row = {"source": source, "tokens": built.tokens, "pass": args.which, "compiled": args.compile,
           "dropout": args.dropout, "masks": args.masks, "max_dev": dev,
           "patch": report.counts(),
           "kernel_ms": {w: sum(k.values()) for w, k in per.items()},
           "groups": {w: {} for w in per}, "kernels": per}
    for w, k in per.items():
        for name, ms in k.items():
            row["groups"][w][group(name)] = row["groups"][w].get(group(name), 0.0) + ms
    t, q = row["kernel_ms"]["torch"], row["kernel_ms"]["patch"]
    print(f"kernel ms per {args.which}: torch {t:.3f}, patch {q:.3f}, {t / q:.3f}x")
    for g in sorted(set(row["groups"]["torch"]) | set(row["groups"]["patch"])):
        a, b = row["groups"]["torch"].get(g, 0.0), row["groups"]["patch"].get(g, 0.0)
        print(f"  {g:13s} torch {a:8.3f} ms  patch {b:8.3f} ms  ({b - a:+.3f})")
    names = set(per["torch"]) | set(per["patch"])
    diff = sorted(((per["patch"].get(n, 0.0) - per["torch"].get(n, 0.0), n) for n in names), key=lambda d: -abs(d[0]))
    print(f"the {args.top} kernels differing most, patch minus torch (ms per {args.which}):")
    for d, n in diff[:args.top]:
        print(f"  {d:+9.4f}  torch {per['torch'].get(n, 0.0):8.4f}  [{group(n)}] {n[:120]}")
    if args.ops:
        row["ops"] = {}
        for w, m in ways.items():
            row["ops"][w] = launching_ops(lambda m=m: run(m), 2, args.ops)
            print(f"the {args.ops} longest kernels of {w}, by launching operator (ms per {args.which}):")
            for r in row["ops"][w]:
                print(f"  {r['ms']:8.4f}  [{group(r['kernel'])}] {r['kernel'][:100]}")
                for where, ms in r["ops"].items():
                    print(f"            {ms:8.4f}  {where}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
