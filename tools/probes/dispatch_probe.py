"""Host time per call for tiny ops (kernel time negligible), CUDA-graph capture of the ops.

    python tools/probes/dispatch_probe.py            # prints a table and a JSON line
Set XKERNELS_DIRECT_LAUNCH=0 to compare against Triton's own C launch function (hot entries
still used), XKERNELS_FAST_LAUNCH=0 against Triton's kernel[grid] launch path. The "parts" table
times the pieces of one hot `add` call on their own, without a profiler.
"""

import json
import os
import statistics
import time

import torch

from xkernels.ops import add, broadcast, linear, matmul


def wall_us(fn, n=2000, rounds=7):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        res.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(res)


def paired_us(ours, theirs, n=2000, rounds=11):
    """Medians of alternating rounds of ``ours`` and ``theirs`` and the median per-round ratio:
    the host's speed drifts between processes and over seconds, so the two share every round."""
    a, t = [], []
    for _ in range(rounds):
        a.append(wall_us(ours, n, 1))
        t.append(wall_us(theirs, n, 1))
    return statistics.median(a), statistics.median(t), statistics.median(x / y for x, y in zip(a, t))

x = torch.randn(1024, device="cuda")
y = torch.randn(1024, device="cuda")
out = torch.empty_like(x)
m = torch.randn(32, 32, device="cuda")
b = torch.randn(32, device="cuda")
rows = {
    "add 1024": (lambda: add(x, y), lambda: torch.add(x, y)),
    "add 1024 out=": (lambda: add(x, y, out=out), lambda: torch.add(x, y, out=out)),
    "broadcast 32x32": (lambda: broadcast(m, b), lambda: m + b),
    "matmul 32^3": (lambda: matmul(m, m), lambda: torch.matmul(m, m)),
}
result = {"fast_launch": os.environ.get("XKERNELS_FAST_LAUNCH", "1") != "0"}
for name, (ours, theirs) in rows.items():
    a, t, r = paired_us(ours, theirs)
    result[name] = {"xkernels_us": round(a, 2), "torch_us": round(t, 2), "ratio": round(r, 2)}
    print(f"{name:18s} xkernels {a:7.2f} us  torch {t:7.2f} us  ratio {r:5.2f} (median of paired rounds)")

# The pieces of one hot call, each timed alone in a loop (no profiler).
from xkernels.ops.op import _key  # noqa: E402

args = (x, y)
hot = add._hot.get(_key(args))
cells = [c.cell_contents for c in (hot.__closure__ or ())] if hot is not None else []
launch = next((c for c in cells if callable(c) and type(c).__name__ in ("Record", "function")
               and getattr(c, "__name__", "") != "hot"), None)
o = torch.empty_like(x)
stream_of = torch._C._cuda_getCurrentRawStream
parts = {
    "_key(args)": lambda: _key(args),
    "hot-entry lookup": lambda: add._hot.get(_key(args)),
    "torch.empty_like(x)": lambda: torch.empty_like(x),
    "torch.empty(n, dtype, device)": lambda: torch.empty(1024, dtype=torch.float32, device="cuda"),
    "x.new_empty(n)": lambda: x.new_empty(1024),
    "torch.add(x, y)": lambda: torch.add(x, y),
    "add(x, y)": lambda: add(x, y),
    "current stream": lambda: stream_of(torch._C._cuda_getDevice()),
    "3x data_ptr": lambda: (x.data_ptr(), y.data_ptr(), o.data_ptr()),
}
if launch is not None:
    parts[f"launch ({type(launch).__name__})"] = lambda: launch(x, y, o)
if type(launch).__name__ == "Record":
    n = 20000
    launch.bench(1000)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    launch.bench(n)
    torch.cuda.synchronize()
    result["cuLaunchKernel from a C loop us"] = round((time.perf_counter() - t0) / n * 1e6, 2)
    print(f"{'cuLaunchKernel, C loop':22s} {result['cuLaunchKernel from a C loop us']:7.2f} us")
for name, fn in parts.items():
    result[f"part {name} us"] = round(wall_us(fn), 2)
    print(f"{name:22s} {result[f'part {name} us']:7.2f} us")

# CUDA graphs: capture the ops, replay with new data, compare.
g = torch.cuda.CUDAGraph()
xs, ys = torch.randn(4096, 512, device="cuda"), torch.randn(512, device="cuda")
w, bb = torch.randn(256, 512, device="cuda"), torch.randn(256, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(2):
        broadcast(xs, ys), linear(xs, w, bb, "gelu")
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    o1 = broadcast(xs, ys)
    o2 = linear(xs, w, bb, "gelu")
xs.copy_(torch.randn_like(xs))
g.replay()
torch.cuda.synchronize()
ok1 = torch.allclose(o1, xs + ys)
ok2 = torch.allclose(o2, torch.nn.functional.gelu(torch.nn.functional.linear(xs, w, bb)), rtol=1e-2, atol=1e-2)
result["cuda_graph_replay_correct"] = bool(ok1 and ok2)
print("CUDA graph capture + replay with new inputs correct:", ok1 and ok2)
print("JSON", json.dumps(result))

if os.environ.get("PROFILE"):
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        add(x, y)
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
