"""Where a zoo model's eager step spends host time, torch against patched, on the device.

Question: a patched ViT training step ran 0.94-0.96x torch's wall time on an H100 at 1.00x of its
device time, its host column 0.91x (results/2026-11-25-h100-models-eager-host-column), while on
the CPU, with the cuda backend's training policies and every launch stubbed, its host cost was
1.01x torch's (tools/probes/host_training.py). Prediction: with the policies sending every ViT
block and linear to PyTorch's ops in training, the patched step calls the same aten ops; any
host difference is Python around them (the patched forwards, the policy lookups), visible as
functions that only the patched profile holds.

    python tools/probes/model_host_profile.py [--model vit] [--pass step|forward] [--steps 10] [--top 25]
                                              [--ways torch,enable,patch] [--aten]
                                              [--size tiny --device cpu]

Per way (``--ways``; ``enable`` runs under ``xkernels.enabled()``): first ``--steps`` unprofiled
steps, each timed to the end of its host part and to the device sync after it (host ms and wall
ms, median). Then ``--steps`` steps after 3 warm-up steps, each followed by a device sync (so the
host never waits on a full launch queue inside the profiled calls), profiled by cProfile;
printed: ms per step (host, up to the sync), Python function calls per step, and the top
functions by own time. With ``--aten``, the same steps under ``torch.profiler`` too: per aten op,
calls and self CPU µs per step. Then, per way after the first, the functions (and aten ops)
whose own time per step differs most from the first way's.

``--alternate N`` first runs N rounds that switch way every step (a warm-up step after each
switch, then one timed step): per way, the median host ms (wall clock and the thread's CPU time,
which leaves out time the host's scheduler gave to others), wall ms and ms in Python's garbage
collector, and per way after the first the median of the per-round ratios. This host's speed
drifts by tens of percent over seconds; ways measured one after another inherit the drift, ways
switched every step do not.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit", help="a zoo model, or a transformers config.json path")
    ap.add_argument("--batch", type=int, default=None, help="with a config.json")
    ap.add_argument("--seq", type=int, default=None, help="with a config.json")
    ap.add_argument("--pass", dest="which", choices=["step", "forward"], default="step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="base", help="the zoo's size: base, or tiny (a CPU smoke run)")
    ap.add_argument("--ways", default="torch,patch",
                    help="among torch, enable, patch, patch-sites-as-written (--alternate only; the first is the reference)")
    ap.add_argument("--aten", action="store_true", help="also profile the aten ops' host time (torch.profiler)")
    ap.add_argument("--alternate", type=int, default=0, help="rounds that switch way every step (0: none)")
    args = ap.parse_args()

    import torch

    import xkernels
    from xkernels.backends import native
    from xkernels.harness import model_zoo
    from xkernels.harness.model_runs import eager_mask_decisions, loss_of

    native.module(wait=True)  # as bench does: every run takes the native paths where they build

    dev = torch.device(args.device)
    if args.model.endswith(".json"):  # a transformers config.json, as bench --model-config takes it
        built = model_zoo.build(model_zoo.read_config(args.model), f"--model-config {args.model}",
                                getattr(torch, args.dtype), dev, args.batch, args.seq)
    else:
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
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    if args.alternate:
        alternate(ways, args.alternate, model, call, sync)
    per_way: dict[str, dict[str, float]] = {}
    per_aten: dict[str, dict[str, tuple[float, float]]] = {}
    for way in (w for w in ways if w != "patch-sites-as-written"):  # (that way: --alternate only)
        report = xkernels.patch(model) if way == "patch" else None
        routing = xkernels.enabled() if way == "enable" else contextlib.nullcontext()
        with routing:
            for _ in range(3):
                call()
            sync()
            hosts, walls = [], []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                call()
                t1 = time.perf_counter()
                sync()
                hosts.append(t1 - t0)
                walls.append(time.perf_counter() - t0)
            print(f"== {args.model} {args.which} {way}: unprofiled host {statistics.median(hosts) * 1e3:.2f} ms, "
                  f"wall {statistics.median(walls) * 1e3:.2f} ms per step (median of {args.steps})")
            prof, host = cProfile.Profile(), 0.0
            for _ in range(args.steps):
                t0 = time.perf_counter()
                prof.enable()
                call()
                prof.disable()
                host += time.perf_counter() - t0
                sync()
            if args.aten:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
                    for _ in range(args.steps):
                        call()
                        sync()
                per_aten[way] = {e.key: (e.count / args.steps, e.self_cpu_time_total / args.steps)
                                 for e in tp.key_averages()}
            if way == "enable":
                print(f"  routing per step: {xkernels.routing_counts(reset=True)} (all steps)")
        stats = pstats.Stats(prof)
        calls = sum(v[1] for v in stats.stats.values())
        print(f"== {args.model} {args.which} {way}: host {host / args.steps * 1e3:.2f} ms per step (profiled), "
              f"{calls / args.steps:.0f} Python calls per step")
        own = {f"{Path(k[0]).name}:{k[1]}({k[2]})": v[2] / args.steps * 1e3 for k, v in stats.stats.items()}
        per_way[way] = own
        for name, ms in sorted(own.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {ms:8.3f} ms  {name}")
        if way in per_aten:
            print(f"  aten ops by self CPU µs per step (calls per step), {sum(v[1] for v in per_aten[way].values()):.0f} "
                  "µs in all:")
            for name, (n, us) in sorted(per_aten[way].items(), key=lambda kv: -kv[1][1])[:args.top]:
                print(f"  {us:9.1f} µs  {n:6.1f}  {name}")
        if report is not None:
            report.undo()
    first = ways[0]
    for way in (w for w in ways[1:] if w in per_way):
        a, b = per_way[first], per_way[way]
        diff = sorted(((b.get(k, 0.0) - a.get(k, 0.0), k) for k in set(a) | set(b)), key=lambda t: -abs(t[0]))
        print(f"== own ms per step, {way} minus {first} (largest first)")
        for d, k in diff[:args.top]:
            print(f"  {d:+8.3f} ms  {k}")
        if args.aten:
            a2, b2 = per_aten[first], per_aten[way]
            diff2 = sorted(((b2.get(k, (0, 0))[1] - a2.get(k, (0, 0))[1], b2.get(k, (0, 0))[0] - a2.get(k, (0, 0))[0], k)
                            for k in set(a2) | set(b2)), key=lambda t: -abs(t[0]))
            print(f"== aten self CPU µs per step (and calls), {way} minus {first}")
            for d, n, k in diff2[:args.top]:
                print(f"  {d:+9.1f} µs  {n:+6.1f}  {k}")
    return 0


@contextlib.contextmanager
def sites_as_written(on: bool) -> Any:
    """The ``patch-sites-as-written`` way: patched, but every add + norm site of a rewritten forward
    (``xkernels/add_norm_forms.py``) runs as written: the host cost of those sites alone."""
    from xkernels import block_steps
    saved = block_steps._site_step
    if on:
        block_steps._site_step = lambda *a: None
    try:
        yield
    finally:
        block_steps._site_step = saved


def alternate(ways: list[str], rounds: int, model: Any, call: Callable[[], None], sync: Callable[[], None]) -> None:
    """``rounds`` rounds, each one timed step per way (after one warm-up step in that way)."""
    import xkernels

    gc_s = [0.0]
    started = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - started[0]

    times: dict[str, list[tuple[float, float, float, float]]] = {w: [] for w in ways}
    gc.callbacks.append(on_gc)
    try:
        for r in range(rounds):
            for way in ways if r % 2 == 0 else ways[::-1]:
                report = xkernels.patch(model) if way.startswith("patch") else None
                routing = xkernels.enabled() if way == "enable" else contextlib.nullcontext()
                with routing, sites_as_written(way == "patch-sites-as-written"):
                    call()
                    sync()
                    gc_s[0] = 0.0
                    t0, c0 = time.perf_counter(), time.thread_time()
                    call()
                    t1, c1 = time.perf_counter(), time.thread_time()
                    sync()
                    times[way].append(((t1 - t0) * 1e3, (c1 - c0) * 1e3, (time.perf_counter() - t0) * 1e3,
                                       gc_s[0] * 1e3))
                if report is not None:
                    report.undo()
    finally:
        gc.callbacks.remove(on_gc)
    med = statistics.median
    print(f"== alternating ways every step, {rounds} rounds: median host ms (thread CPU ms), wall ms, gc ms")
    for way in ways:
        t = times[way]
        line = (f"  {way:<8} host {med(x[0] for x in t):7.2f} ({med(x[1] for x in t):7.2f})  "
                f"wall {med(x[2] for x in t):7.2f}  gc {med(x[3] for x in t):6.3f}")
        if way != ways[0]:
            ref = times[ways[0]]
            ratio = [med(a[i] / b[i] for a, b in zip(ref, t)) for i in range(3)]
            line += f"  vs {ways[0]}: wall {ratio[2]:.3f}x, host {ratio[0]:.3f}x, thread CPU {ratio[1]:.3f}x"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
