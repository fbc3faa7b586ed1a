"""Sweep kernel configs on the current device and write tuning tables from the measurements.

    python -m xkernels.tune --backend cuda --op broadcast,add,matmul --out-dir results/tune

For each op, each bucket (a representative case) and each candidate config, the op runs with
``xkernels.tuning.force(config)``, is checked against PyTorch, and timed with the backend's
events (median of repeated runs, inputs never zero). The fastest correct config of each bucket
becomes a rule of ``<out-dir>/<op>.json`` under the device's arch key, with the sweep command and
device recorded in its "source". Copy reviewed tables into ``ops/tuning/<backend>/``.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

import xkernels
from xkernels import tuning

F16 = ["float16", "bfloat16"]


def _time_ms(backend: xkernels.Backend, fn, reps: int = 20) -> float:
    """Median over 5 rounds of the mean time of ``reps`` back-to-back calls (device throughput:
    the queue stays full, so host dispatch is hidden whenever the kernel is longer than it)."""
    for _ in range(3):
        fn()
    backend.synchronize()
    rounds = []
    for _ in range(5):
        s, e = backend.Event(enable_timing=True), backend.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        backend.synchronize()
        rounds.append(s.elapsed_time(e) / reps)
    return statistics.median(rounds)


def _buckets(op: str, dev: str) -> list[tuple[dict[str, Any], Any, list[dict[str, Any]]]]:
    """(table 'when', case maker, candidate configs) per bucket."""
    ew_tiled = [{"BLOCK_M": m, "BLOCK_N": n, "num_warps": w}
                for m, n, w in itertools.product([1, 2, 4, 8, 16, 32], [256, 512, 1024, 2048], [4, 8])
                if m * n <= 32768]
    ew_flat = [{"BLOCK": b, "num_warps": w} for b, w in itertools.product([1024, 2048, 4096, 8192, 16384], [4, 8, 16])]
    out: list = []
    if op in ("broadcast", "add"):
        for dt in ("float32", "bfloat16"):
            for lo, hi, rows, cols in [(0, 2**20, 512, 1024), (2**20 + 1, 2**24 - 1, 2048, 4096),
                                       (2**24, 2**62, 8192, 8192)]:
                d = getattr(torch, dt)
                def mk(rows=rows, cols=cols, d=d):
                    x = torch.randn(rows, cols, device=dev).to(d)
                    return x, torch.randn(cols, device=dev).to(d)
                out.append(({"variant": "tiled", "dtype": [dt] + (["float16"] if dt == "bfloat16" else []),
                             "numel_min": lo, "numel_max": hi}, mk, ew_tiled))
                if op == "add":
                    def mkf(rows=rows, cols=cols, d=d):
                        return (torch.randn(rows, cols, device=dev).to(d), torch.randn(rows, cols, device=dev).to(d))
                    out.append(({"variant": "flat", "dtype": [dt] + (["float16"] if dt == "bfloat16" else []),
                                 "numel_min": lo, "numel_max": hi}, mkf, ew_flat))
    elif op in ("matmul", "linear"):
        mm = [{"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "num_warps": w, "num_stages": s}
              for m, n, k, w, s in [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
                                    (128, 128, 64, 8, 4), (128, 256, 32, 8, 4), (64, 256, 64, 4, 4),
                                    (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4),
                                    (16, 128, 128, 4, 4), (16, 256, 128, 8, 3), (32, 128, 128, 4, 4),
                                    (64, 128, 128, 4, 3), (32, 64, 256, 4, 3)]]
        # fp32 linear (IEEE dot, K-contiguous B) runs some configs at ~1 TFLOP/s: not swept
        for dt in ("bfloat16", "float32") if op == "matmul" else ("bfloat16",):
            d = getattr(torch, dt)
            dts = [dt] + (["float16"] if dt == "bfloat16" else [])
            for when, (M, N, K) in [({"m_max": 64}, (64, 4096, 4096)), ({"k_max": 256}, (4096, 4096, 256)),
                                    ({"m_max": 2048}, (2048, 2048, 2048)), ({}, (4096, 4096, 4096))]:
                def mkm(M=M, N=N, K=K, d=d):
                    if op == "linear":  # x (M, K), weight (N, K): B is K-contiguous; bias + gelu epilogue
                        return (torch.randn(M, K, device=dev).to(d), torch.randn(N, K, device=dev).to(d),
                                torch.randn(N, device=dev).to(d), "gelu")
                    return torch.randn(M, K, device=dev).to(d), torch.randn(K, N, device=dev).to(d)
                out.append(({"dtype": dts, **when}, mkm, mm))
    return out


def sweep(backend_name: str, op_name: str, reps: int) -> dict[str, Any]:
    backend = xkernels.get_backend(backend_name)
    backend.require_available()
    op = getattr(xkernels.ops, op_name)
    dev = backend.device_type
    arch = backend.arch()
    rules, report = [], []
    for when, mk, candidates in _buckets(op_name, dev):
        args = mk()
        from xkernels.ops.matmul import reference_linear

        torch_fn = {"broadcast": lambda a, b: a + b, "add": torch.add, "matmul": torch.matmul,
                    "linear": reference_linear}[op_name]
        ref = torch_fn(*args)
        torch_ms = _time_ms(backend, lambda: torch_fn(*args), reps)
        best = None
        with xkernels.use_backend(backend.name):
            for cfg in candidates:
                try:
                    with tuning.force(cfg):
                        got = op(*args)
                        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)
                        ms = _time_ms(backend, lambda: op(*args), reps)
                except Exception as exc:  # a config that fails to compile or is wrong is skipped
                    report.append({"when": when, "config": cfg, "error": repr(exc)[:200]})
                    continue
                report.append({"when": when, "config": cfg, "ms": ms, "torch_ms": torch_ms})
                if best is None or ms < best[0]:
                    best = (ms, cfg)
        if best is not None:
            shape = [list(a.shape) for a in args if isinstance(a, torch.Tensor)]
            rules.append({"when": when, "config": best[1],
                          "measured": {"shapes": shape, "ms": round(best[0], 5), "torch_ms": round(torch_ms, 5),
                                       "speedup": round(torch_ms / best[0], 3)}})
            print(f"{op_name} {when} {shape}: best {best[1]} {best[0]:.4f} ms, torch {torch_ms:.4f} ms "
                  f"({torch_ms / best[0]:.2f}x)", flush=True)
    props = backend.properties()
    source = (f"python -m xkernels.tune --backend {backend_name} --op {op_name}; {props.name}; "
              f"{datetime.date.today()}; torch {torch.__version__}; triton {_triton_version()}")
    return {"table": {"op": op_name, "backend": backend_name, "source": source, "archs": {arch: rules}},
            "report": report}


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "none"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m xkernels.tune", description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--op", default="broadcast,add,matmul")
    p.add_argument("--out-dir", type=Path, default=Path("tune-out"))
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args(argv)
    reason = xkernels.get_backend(a.backend).unavailable_reason()
    if reason:
        print(f"xkernels.tune: backend {a.backend!r} is not available: {reason}", file=sys.stderr)
        return 2
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for op in a.op.split(","):
        res = sweep(a.backend, op, a.reps)
        (a.out_dir / f"{op}.json").write_text(json.dumps(res["table"], indent=1))
        (a.out_dir / f"{op}.sweep.json").write_text(json.dumps(res["report"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
