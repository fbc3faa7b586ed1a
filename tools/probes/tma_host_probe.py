"""Why TMA matmul rows of the bench are slow and noisy while the tune sweep timed the same config
fast: the bench rotates several input sets, the sweep uses one. This times the same call both ways.

    python tools/probes/tma_host_probe.py
"""

import cProfile
import pstats
import statistics
import time
from dataclasses import replace

import torch

from xkernels import get_backend, tuning
from xkernels.harness import Target
from xkernels.harness.perf import FULL, time_calls
from xkernels.ops import linear, matmul

backend = get_backend("cuda")
target = Target(backend, torch.device("cuda"))
POINTER = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 4}


def host_us(fn, sets, n=300):
    for s in sets:
        fn(s)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(n):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def mk(op, m, k, n, dtype):
    if op is linear:
        return (torch.randn(m, k, device="cuda").to(dtype), torch.randn(n, k, device="cuda").to(dtype),
                torch.randn(n, device="cuda").to(dtype), "gelu")
    return torch.randn(m, k, device="cuda").to(dtype), torch.randn(k, n, device="cuda").to(dtype)


for op, (m, k, n), dtype in [(matmul, (4096, 256, 4096), torch.bfloat16), (matmul, (2048, 2048, 2048), torch.float16),
                             (linear, (2048, 2048, 2048), torch.float16)]:
    sets = [mk(op, m, k, n, dtype) for _ in range(3)]
    run = lambda s: op(*s)  # noqa: E731
    print(f"== {op.name} {m}x{k}x{n} {dtype}: {op.explain(*sets[0]).config}")
    plan = op.make_plan(op.check(*sets[0]), backend)
    print("   launcher fast path:", plan.launcher.fast)
    for label, cfg in (("table", None), ("pointer kernel", POINTER)):
        ctx = tuning.force(cfg) if cfg else None
        if ctx:
            ctx.__enter__()
        try:
            one = time_calls(run, sets[:1], target, FULL)
            three = time_calls(run, sets, target, FULL)
            noflush = time_calls(run, sets, target, replace(FULL, flush=False))
            h1, h3 = host_us(run, sets[:1]), host_us(run, sets)
        finally:
            if ctx:
                ctx.__exit__(None, None, None)
        print(f"   {label:15s} device ms: 1 set {one.median_ms:.4f} ({one.p20_ms:.4f}-{one.p80_ms:.4f}); "
              f"3 sets {three.median_ms:.4f} ({three.p20_ms:.4f}-{three.p80_ms:.4f}); 3 sets no flush "
              f"{noflush.median_ms:.4f}; host us per call: 1 set {h1:.1f}, 3 sets {h3:.1f}")
    tt = time_calls(lambda s: torch.matmul(s[0], s[1]) if op is matmul else
                    torch.nn.functional.gelu(torch.nn.functional.linear(s[0], s[1], s[2])), sets, target, FULL)
    print(f"   torch 3 sets {tt.median_ms:.4f}")
    prof = cProfile.Profile()
    prof.enable()
    for i in range(300):
        run(sets[i % 3])
    torch.cuda.synchronize()
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(12)
    print("   per-call wall from profile (us):", statistics.mean([st.total_tt / 300 * 1e6]))
