"""Where a zoo model's eager step spends host time, torch against patched, on the device.

Question: a patched ViT training step ran 0.94-0.96x torch's wall time on an H100 at 1.00x of its
device time, its host column 0.91x (results/2026-11-25-h100-models-eager-host-column), while on
the CPU, with the cuda backend's training policies and every launch stubbed, its host cost was
1.01x torch's (tools/probes/host_training.py). Prediction: with the policies sending every ViT
block and linear to PyTorch's ops in training, the patched step calls the same aten ops; any
host difference is Python around them (the patched forwards, the policy lookups), visible as
functions that only the patched profile holds.

    python tools/probes/model_host_profile.py [--model vit] [--pass step|forward] [--steps 10] [--top 25]
                                              [--size tiny --device cpu]

Per way (torch, patch): ``--steps`` steps after 3 warm-up steps, each followed by a device sync
(so the host never waits on a full launch queue inside the profiled calls), timed with
``perf_counter`` and profiled by cProfile; printed: ms per step (host, up to the sync), Python
function calls per step, and the top functions by own time. Then the functions whose own time
per step differs most between the ways.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit")
    ap.add_argument("--pass", dest="which", choices=["step", "forward"], default="step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="base", help="the zoo's size: base, or tiny (a CPU smoke run)")
    args = ap.parse_args()

    import torch

    import xkernels
    from xkernels.backends import native
    from xkernels.harness import model_zoo
    from xkernels.harness.model_runs import eager_mask_decisions, loss_of

    native.module(wait=True)  # as bench does: every run takes the native paths where they build

    dev = torch.device(args.device)
    built = model_zoo.build(model_zoo.zoo_config(args.model, args.size), f"--model {args.model}",
                            getattr(torch, args.dtype), dev, zoo_name=args.model, size=args.size)
    model, inputs = built.model, built.inputs

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def call() -> None:
        with eager_mask_decisions(inputs):
            if args.which == "forward":
                with torch.no_grad():
                    model(**inputs)
            else:
                model.zero_grad(set_to_none=True)
                loss_of(model(**inputs)).backward()

    model.train(args.which == "step")
    per_way: dict[str, dict[str, float]] = {}
    for way in ("torch", "patch"):
        report = xkernels.patch(model) if way == "patch" else None
        for _ in range(3):
            call()
        sync()
        prof, host = cProfile.Profile(), 0.0
        for _ in range(args.steps):
            t0 = time.perf_counter()
            prof.enable()
            call()
            prof.disable()
            host += time.perf_counter() - t0
            sync()
        stats = pstats.Stats(prof)
        calls = sum(v[1] for v in stats.stats.values())
        print(f"== {args.model} {args.which} {way}: host {host / args.steps * 1e3:.2f} ms per step (profiled), "
              f"{calls / args.steps:.0f} Python calls per step")
        own = {f"{Path(k[0]).name}:{k[1]}({k[2]})": v[2] / args.steps * 1e3 for k, v in stats.stats.items()}
        per_way[way] = own
        for name, ms in sorted(own.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {ms:8.3f} ms  {name}")
        if report is not None:
            report.undo()
    a, b = per_way["torch"], per_way["patch"]
    diff = sorted(((b.get(k, 0.0) - a.get(k, 0.0), k) for k in set(a) | set(b)), key=lambda t: -abs(t[0]))
    print("== own ms per step, patch minus torch (largest first)")
    for d, k in diff[:args.top]:
        print(f"  {d:+8.3f} ms  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
