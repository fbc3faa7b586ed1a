"""Host time per call for tiny ops (kernel time negligible), CUDA-graph capture of the ops.

    python results/dispatch_probe.py            # prints a table and a JSON line
Set XKERNELS_FAST_LAUNCH=0 to compare against Triton's kernel[grid] launch path.
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
    a, t = wall_us(ours), wall_us(theirs)
    result[name] = {"xkernels_us": round(a, 2), "torch_us": round(t, 2), "ratio": round(a / t, 2)}
    print(f"{name:18s} xkernels {a:7.2f} us  torch {t:7.2f} us  ratio {a / t:5.2f}")

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
