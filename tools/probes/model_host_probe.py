"""Host time of a whole model's forward, torch eager against ``xkernels.patch(model)``: the device
is held busy (a spin kernel) before each forward, so the host never waits on it and the wall time
of the call is the host's own; the two ways alternate in rounds on one model (patch applied and
undone). Then: how many calls took the full path during a patched forward, the host µs of each
distinct linear call of the model against torch's, and a cProfile of one forward each way.

Question: session 7's bench measured BERT-base's patched forward at 0.60x torch in time but 0.98x
in device time, and its kernels at parity. Prediction: the patched forward's host time is torch's
plus ~3 µs per linear (the front door; 73 linears: ~0.2 ms), unless something takes the full path.

    python tools/probes/model_host_probe.py [--model bert-base] [--batch 16] [--seq 512]
"""

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

import xkernels
from xkernels.cli import bench_models
from xkernels.ops import linear
from xkernels.ops.op import Op

HOLD_CYCLES = 2_000 * 60_000  # ~60 ms at 2 GHz: longer than any forward's host time here


def host_ms(fn, n=10):
    out = []
    for _ in range(n):
        torch.cuda._sleep(HOLD_CYCLES)
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(out)


def profile(fn, label):
    prof = cProfile.Profile()
    torch.cuda._sleep(HOLD_CYCLES)
    prof.enable()
    fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
    print(f"--- {label}: cProfile of one forward (device held), by own time")
    print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[-4000:], flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-base")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    args = ap.parse_args()
    built = bench_models.build(args.model, "base", args.batch, args.seq, torch.bfloat16, torch.device("cuda"), 0)
    model, ids = built.model.eval(), built.ids

    def forward():
        with torch.no_grad():
            return model(ids)

    for _ in range(3):
        forward()
    report = xkernels.patch(model)
    for _ in range(3):
        forward()
    report.undo()
    rounds = {"torch": [], "patch": []}
    for r in range(5):
        for way in ("torch", "patch") if r % 2 == 0 else ("patch", "torch"):
            report = xkernels.patch(model) if way == "patch" else None
            forward()
            rounds[way].append(host_ms(forward))
            if report is not None:
                report.undo()
    for way, ms in rounds.items():
        print(f"host ms per forward, {way:5}: median {statistics.median(ms):.3f}  rounds {[round(m, 3) for m in ms]}")

    report = xkernels.patch(model)
    full, seen = [], {}
    real_full = Op._full_path
    real_linear_call = type(linear).__call__

    def counting_full(self, a, k):
        full.append(self.name)
        return real_full(self, a, k)

    def recording_call(self, *a, **k):
        if self is linear:
            x, w, b, act = (list(a) + [None, None])[:4]
            seen.setdefault((tuple(x.shape), tuple(w.shape), b is not None, act), (x, w, b, act))
        return real_linear_call(self, *a, **k)

    Op._full_path = counting_full
    type(linear).__call__ = recording_call
    try:
        forward()
    finally:
        Op._full_path = real_full
        type(linear).__call__ = real_linear_call
    print(f"calls that took the full path in one patched forward: {len(full)} {sorted(set(full))}")
    for key, (x, w, b, act) in seen.items():
        def ours():
            with torch.no_grad():
                for _ in range(20):
                    linear(x, w, b, act)

        def theirs():
            with torch.no_grad():
                for _ in range(20):
                    y = F.linear(x, w, b)
                    if act == "gelu":
                        F.gelu(y)
                    elif act == "gelu_tanh":
                        F.gelu(y, approximate="tanh")

        print(f"linear {key}: host us per call xkernels {host_ms(ours) * 50:.1f}  torch {host_ms(theirs) * 50:.1f}  "
              f"route {linear.explain(x, w, b, act).route}", flush=True)
    profile(forward, "patched")
    report.undo()
    profile(forward, "torch")


if __name__ == "__main__":
    main()
