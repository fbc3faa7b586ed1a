"""A patched model under ``torch.compile`` against torch's compiled model, as a user runs them:
each way on its own copy of the model, patched once, compiled once. Per way: the host's time to
queue one forward (the device held busy, so the queue never waits), the wall time of a forward,
Dynamo's recompiles and the guards of the compiled frame; then the same patched copy re-patched
between rounds (as ``bench --model --mode compile`` switches one model between its ways), to see
whether the switching itself costs the compiled call.

    python tools/probes/compiled_host.py --cases llama:16,llama:2048,bert-base:128 --json compiled-host.json
    python tools/probes/compiled_host.py --cases llama:16 --mode default --mode reduce-overhead
    python tools/probes/compiled_host.py --cases tools/probes/data/families/phi-3-mini.json:2048

``--mode reduce-overhead`` compiles with CUDA graphs (the host cost of a replay is small, so the
wall time is about the device's); the re-patching part is then left out.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time

import torch

import xkernels
from xkernels.harness import model_zoo
from xkernels.harness.model_runs import eager_mask_decisions

#: forwards queued per host sample: few enough that their launches never fill the driver's queue
#: while the device is held (20 BERT-base forwards did: the host then waited for the hold)
HOST_CALLS = 4
WALL_CALLS = 20


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def busy_host_us(fn, calls=HOST_CALLS):
    """Host µs per call with the device held busy for longer than the calls take to queue."""
    sync()
    if torch.cuda.is_available():
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU clock: the queue drains after the host is done
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    sync()
    return host


def wall_us(fn, calls=WALL_CALLS):
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t) / calls * 1e6


def quantiles(v):
    q = statistics.quantiles(v, n=5)
    return [q[0], q[-1]]


def compiled_call(model, inputs, backend, mode=None):
    compiled = torch.compile(model, backend=backend, mode=mode)
    graphs = mode == "reduce-overhead"  # CUDA graphs: each call a new step of the graph trees

    def call():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad(), eager_mask_decisions(inputs):
            return compiled(**inputs)
    return call


@contextlib.contextmanager
def no_graph_kernels(on):
    """While tracing: every launch decision of the compiled paths says no (``launch_spec``)."""
    from xkernels.ops.fused import gated_linear_compiled
    from xkernels.ops.matmul import compiled
    saved = gated_linear_compiled.launch_spec, compiled.launch_spec
    if on:
        gated_linear_compiled.launch_spec = compiled.launch_spec = lambda *a, **k: None
    try:
        yield
    finally:
        gated_linear_compiled.launch_spec, compiled.launch_spec = saved


def frames():
    from torch._dynamo.utils import counters
    return {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles", "frames")}


def measure(name, seq, rounds, size, device, backend, mode=None):
    if name.endswith(".json"):  # a config.json (bench --model-config's), at its own size
        data, source, name = model_zoo.read_config(name), f"--model-config {name}", name.rsplit("/", 1)[-1][:-5]
    else:
        data, source = model_zoo.zoo_config(name, size), f"--model {name}"
    built = model_zoo.build(data, source, torch.bfloat16, torch.device(device), seq=seq)
    base = built.model.eval()
    mine = copy.deepcopy(base)
    report = xkernels.patch(mine)
    plain = copy.deepcopy(base)
    xkernels.patch(plain)
    torch._dynamo.reset()
    calls = {"torch": compiled_call(base, built.inputs, backend, mode),
             "patch": compiled_call(mine, built.inputs, backend, mode),
             # the patched model traced with no fused kernel launched from the graph (gated MLPs,
             # linear + activation): the class forwards, as before those launches existed
             "patch, no graph kernels": compiled_call(plain, built.inputs, backend, mode)}
    for way, fn in calls.items():
        with no_graph_kernels(way.endswith("no graph kernels")):
            for _ in range(3):  # Dynamo traces at the first call
                fn()
    out_t, out_p = (model_zoo.output_of(calls[w]()).clone() for w in ("torch", "patch"))
    after_warm = frames()
    host = {w: [] for w in calls}
    wall = {w: [] for w in calls}
    for r in range(rounds):
        for w in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
            host[w].append(busy_host_us(calls[w]))
            wall[w].append(wall_us(calls[w]))
    timed = frames()
    # the bench's way of switching: undo and patch the same copy again between rounds
    switched = []
    for _ in range(rounds if mode is None else 0):  # (CUDA graphs: not measured)
        report.undo()
        report = xkernels.patch(mine)
        calls["patch"]()  # a first call after the switch, as the bench's warm-up
        switched.append(busy_host_us(calls["patch"]))
    after_switch = frames()
    row = {"model": name, "seq": seq, "mode": mode or "default", "tokens": built.tokens, "fusions": report.counts(),
           "max_abs_diff": (out_t.float() - out_p.float()).abs().max().item(),
           "host_us": {w: statistics.median(v) for w, v in host.items()},
           "host_us_p20_p80": {w: quantiles(v) for w, v in host.items()},
           "wall_us": {w: statistics.median(v) for w, v in wall.items()},
           "wall_us_p20_p80": {w: quantiles(v) for w, v in wall.items()},
           "patch_host_us_switched_each_round": statistics.median(switched) if switched else None,
           "dynamo_after_warmup": after_warm, "dynamo_after_timing": timed, "dynamo_after_switching": after_switch}
    h, wl = row["host_us"], row["wall_us"]
    hq, wq = row["host_us_p20_p80"], row["wall_us_p20_p80"]
    if "patch, no graph kernels" in h:
        n = "patch, no graph kernels"
        print(f"  {n}: host {h[n]:.0f} [{hq[n][0]:.0f}-{hq[n][1]:.0f}] us, "
              f"wall {wl[n]:.0f} [{wq[n][0]:.0f}-{wq[n][1]:.0f}] us")
    print(f"{name} seq {seq} ({row['mode']}): host torch {h['torch']:.0f} [{hq['torch'][0]:.0f}-{hq['torch'][1]:.0f}] "
          f"patch {h['patch']:.0f} [{hq['patch'][0]:.0f}-{hq['patch'][1]:.0f}] us "
          f"({h['torch'] / h['patch']:.3f}x); wall torch {wl['torch']:.0f} [{wq['torch'][0]:.0f}-{wq['torch'][1]:.0f}] "
          f"patch {wl['patch']:.0f} [{wq['patch'][0]:.0f}-{wq['patch'][1]:.0f}] us "
          f"({wl['torch'] / wl['patch']:.3f}x); re-patched each round: host "
          f"{row['patch_host_us_switched_each_round'] or 0:.0f} us; "
          f"max|diff| {row['max_abs_diff']}")
    print(f"  dynamo after warm-up {after_warm}\n  after timing {timed}\n  after switching {after_switch}")
    del calls, base, mine
    torch._dynamo.reset()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="llama:16,llama:2048",
                    help="model:seq, comma-separated (model: a --model name or a config.json)")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--size", default="base", help="tiny: a dry run of the probe itself")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (eager: a dry run)")
    ap.add_argument("--mode", action="append", choices=("default", "reduce-overhead"),
                    help="torch.compile mode(s), repeat for several (default: default)")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [measure(c.split(":")[0], int(c.split(":")[1]), args.rounds, args.size, args.device, args.backend,
                    None if mode == "default" else mode)
            for mode in args.mode or ["default"] for c in args.cases.split(",")]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
