"""Which calls of a patched model's pass wait for the device (a host-device synchronisation).

A pass that synchronises stalls the host until the device has drained its queue: harmless on an
idle device, a lost overlap on a busy one. ``torch.cuda.set_sync_debug_mode("warn")`` reports
every synchronising torch call (``.item()``, ``nonzero``, a blocking copy, ...) with its stack;
this probe runs each model of ``bench --model`` torch-way and patched, forward (eval, no grad)
and a training step, after warm-up, and prints each distinct synchronising call site (the
innermost frames in xkernels, transformers or the probe) with its count.

    python tools/probes/sync_finder.py [--models bert-base,gpt2,vit,llama] [--layers 2]
"""

from __future__ import annotations

import argparse
import collections
import traceback
import warnings

import torch

import xkernels
from xkernels.cli import bench_models
from xkernels.harness import resolve_target
from xkernels.harness.model_runs import make_runner


def sites(fn) -> collections.Counter:
    found: collections.Counter = collections.Counter()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    stacks: list = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            orig = warnings.showwarning

            def keep(message, category, filename, lineno, file=None, line=None):
                stacks.append((str(message).splitlines()[0], traceback.extract_stack()[:-1]))

            warnings.showwarning = keep
            try:
                fn()
            finally:
                warnings.showwarning = orig
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for msg, stack in stacks:
        keys = ("xkernels", "transformers", "ops/", "backends/")
        frames = [f for f in (stack or []) if any(k in f.filename for k in keys)]
        where = " <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in frames[-3:][::-1])
        found[f"{msg} @ {where or '?'}"] += 1
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert-base,gpt2,vit,llama")
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    target = resolve_target(device="cuda")
    for name in args.models.split(","):
        spec = bench_models.zoo_spec(name, "base")
        from xkernels.harness import model_zoo

        built = model_zoo.build(spec.data, spec.source, torch.bfloat16, target.device, None, None, args.layers, 0,
                                spec.zoo_name, spec.size, False)
        for way in ("torch", "patch"):
            with bench_models._Way(way, built.model):
                runner = make_runner("eager", built.model, built.inputs, target)
                for _ in range(3):
                    runner.forward()
                    runner.train_step()
                for pname, fn in (("forward", runner.forward), ("train_step", runner.train_step)):
                    found = sites(fn)
                    print(f"{name} {way} {pname}: {sum(found.values())} synchronising calls", flush=True)
                    for site, n in found.most_common():
                        print(f"   {n:>4} x {site}", flush=True)
                runner.release()
    print("xkernels", xkernels.__version__ if hasattr(xkernels, "__version__") else "", "torch", torch.__version__)


if __name__ == "__main__":
    main()
