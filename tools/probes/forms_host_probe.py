"""Host time of each documented call form, and where it goes: wall µs per back-to-back call
(xkernels and the equivalent torch call), which hot entry serves it, whether its launch is the
direct C record or Triton's launcher, and the top functions of a cProfile over 3000 calls.

Also the host time of unmodified torch calls routed by ``xkernels.enable()`` (``x + y``,
``torch.mm``, ``torch.addmm``) against the same calls with routing off, and the parts of a hot
``add`` timed alone (signature key, result allocation, launch record, the driver's own
``cuLaunchKernel``). xkernels and torch are timed in alternating rounds, so a drift of the host's
speed meets both. Needs a CUDA device. Output: results/2026-11-23-h100-call-forms-host.

    python tools/probes/forms_host_probe.py
"""

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

from xkernels.ops import add, broadcast, linear


def wall_us(*fns, n=2000, rounds=7):
    """Median µs per back-to-back call of each function, measured in alternating rounds (so a
    drift of the host's speed meets them alike)."""
    for fn in fns:
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    res = [[] for _ in fns]
    for _ in range(rounds):
        for fn, r in zip(fns, res):
            t = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            r.append((time.perf_counter() - t) / n * 1e6)
    return [statistics.median(r) for r in res]


def parts(x: torch.Tensor, y: torch.Tensor) -> None:
    """The pieces of a hot add, timed alone."""
    from xkernels import dispatch

    add(x, y)
    add(x, y)  # the hot entry exists
    alloc = dispatch.select(x.device).allocator(x.device)
    size, stride, dtype = tuple(x.shape), x.stride(), x.dtype
    named = {"torch.add(x, y)": lambda: torch.add(x, y), "torch.empty_like(x)": lambda: torch.empty_like(x),
             "torch.empty(n, dtype=, device=)": lambda: torch.empty(size, dtype=dtype, device=x.device),
             "backend.allocator(device)": lambda: alloc(size, stride, dtype),
             "add.hot_entry lookup": lambda: add.hot_entry(x, y),
             "torch.compiler.is_compiling()": torch.compiler.is_compiling}
    guards = torch._C._dynamo.guards
    entry = add.hot_entry(x, y)
    cells = {c.cell_contents.__class__.__name__: c.cell_contents for c in entry.__closure__}
    o = torch.empty_like(x)
    if "Record" in cells:
        record = cells["Record"]
        named["launch record alone"] = lambda: record(x, y, o)
        named["cuLaunchKernel from C (record.bench)"] = lambda: record.bench(1)
    named.update({
        "_empty_strided_cuda direct": lambda: guards._empty_strided_cuda(size, stride, dtype),
        "torch._C._cuda_getDevice()": torch._C._cuda_getDevice,
        "2t key tuple": lambda: ("2t", None, x.shape, x.stride(), x.dtype, x.device, y.shape, y.stride(), y.dtype,
                                 y.device),
    })
    for (name, _), us in zip(named.items(), wall_us(*named.values())):
        print(f"part {name:34} {us:6.2f} us", flush=True)


def routed(d: torch.device) -> None:
    """Host time of an unmodified torch call routed by xkernels.enable(), against the same call with
    routing off, in alternating rounds (enable() before each xkernels round, disable() after)."""
    import xkernels

    x, y = torch.randn(1024, device=d, dtype=torch.float16), torch.randn(1024, device=d, dtype=torch.float16)
    a, m = torch.randn(32, 512, device=d, dtype=torch.float16), torch.randn(512, 512, device=d, dtype=torch.float16)
    for name, fn in [("enable(): x + y", lambda: x + y), ("enable(): torch.mm(a, b)", lambda: torch.mm(a, m)),
                     ("enable(): torch.addmm(c, a, b)", lambda: torch.addmm(x[:512], a, m))]:
        on, off = [], []
        for _ in range(7):
            xkernels.enable()
            try:
                on.append(wall_us(fn, rounds=1)[0])
            finally:
                xkernels.disable()
            off.append(wall_us(fn, rounds=1)[0])
        print(f"{name:36} xk {statistics.median(on):6.1f} us  torch {statistics.median(off):6.1f} us", flush=True)
    print("routing counts:", xkernels.routing_counts(), flush=True)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    d = torch.device("cuda")
    x, y = torch.randn(1024, device=d, dtype=torch.float16), torch.randn(1024, device=d, dtype=torch.float16)
    X, b = torch.randn(64, 1024, device=d, dtype=torch.float16), torch.randn(1024, device=d, dtype=torch.float16)
    o = torch.empty_like(X)
    xl, w, bl = (torch.randn(32, 512, device=d, dtype=torch.float16), torch.randn(512, 512, device=d, dtype=torch.float16),
                 torch.randn(512, device=d, dtype=torch.float16))
    forms = [
        ("add(x, y)", lambda: add(x, y), lambda: torch.add(x, y), (add, (x, y), {})),
        ("add(x, y, alpha=2)", lambda: add(x, y, alpha=2), lambda: torch.add(x, y, alpha=2), (add, (x, y), {"alpha": 2})),
        ("add(x, 2.0)", lambda: add(x, 2.0), lambda: torch.add(x, 2.0), (add, (x, 2.0), {})),
        ("broadcast(x, b, out=o)", lambda: broadcast(X, b, out=o), lambda: torch.add(X, b, out=o),
         (broadcast, (X, b), {"out": o})),
        ('linear(x, w, b, activation="gelu")', lambda: linear(xl, w, bl, activation="gelu"),
         lambda: F.gelu(F.linear(xl, w, bl)), (linear, (xl, w, bl), {"activation": "gelu"})),
        ("linear(x, w, bias=b)", lambda: linear(xl, w, bias=bl), lambda: F.linear(xl, w, bl),
         (linear, (xl, w), {"bias": bl})),
        ("linear(x, w, b)", lambda: linear(xl, w, bl), lambda: F.linear(xl, w, bl), (linear, (xl, w, bl), {})),
        ('linear(x, w, b, "gelu")', lambda: linear(xl, w, bl, "gelu"), lambda: F.gelu(F.linear(xl, w, bl)),
         (linear, (xl, w, bl, "gelu"), {})),
    ]
    parts(x, y)
    routed(d)
    for name, xk, th, (op, args, kwargs) in forms:
        xk()
        xk()
        entry = op.hot_entry(*args, **kwargs)
        cells = [c.cell_contents for c in (getattr(entry, "__closure__", None) or ())]
        inner = [f for c in cells for f in getattr(c, "fns", {}).values()]  # ByValue's per-value launches
        launch_kinds = sorted({type(c).__name__ + ":" + getattr(c, "__qualname__", "")
                               for c in cells + inner if callable(c)})
        xk_us, torch_us = wall_us(xk, th)
        print(f"{name:36} xk {xk_us:6.1f} us  torch {torch_us:6.1f} us  entry "
              f"{getattr(entry, '__qualname__', entry)}  closure callables {launch_kinds}", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3000):
            xk()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(8)
        print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[-1800:], flush=True)


if __name__ == "__main__":
    main()
