"""Sweep kernel configs on the current device and write tuning tables from the measurements.

    python -m xkernels.tune --backend cuda --op broadcast,add,matmul --out-dir results/tune

For each op, each bucket (a representative case) and each candidate config, the op runs with
``xkernels.tuning.force(config)``, is checked against PyTorch, and timed with the backend's
events (each call alone after a cache flush, median of repeated runs; inputs never zero), so
small buckets are measured by kernel time, not by how fast the host dispatches. The fastest correct config of each bucket
becomes a rule of ``<out-dir>/<op>.json`` under the device's arch key, with the sweep command and
device recorded in its "source". Copy reviewed tables into ``ops/tuning/<backend>/``.

Where the backend has tensor descriptors (sm90+), the fp16/bf16 matmul/linear buckets also try
``matmul_tma_kernel`` configs (``"TMA": true``, some persistent and/or with a subtiled epilogue).
A TMA winner becomes a ``"variant": "tma"`` rule followed by the bucket's best pointer-kernel
config, for the calls that cannot use TMA (see ``bucket_rules``).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import xkernels
from xkernels import tuning
from xkernels.harness import Target
from xkernels.harness.perf import Settings, time_calls

F16 = ["float16", "bfloat16"]


#: Timing of one candidate: each call alone, behind a cache-flushing write, timed by the
#: backend's events (``harness.perf.time_calls``), so host dispatch never enters the figure.
SWEEP = Settings(warmup=3, warmup_s=0.05, min_reps=10, max_reps=60, budget_s=0.15, flush=True)


def _time_ms(backend: xkernels.Backend, fn, reps: int = 0) -> float:
    """Median device milliseconds of one call of ``fn`` (``reps``: fixed repetitions, 0 = budget)."""
    settings = SWEEP if not reps else replace(SWEEP, min_reps=reps, max_reps=reps)
    target = Target(backend, torch.device(backend.device_type))
    return time_calls(lambda _: fn(), [None], target, settings).median_ms


def _buckets(op: str, dev: str, tma: bool = False) -> list[tuple[dict[str, Any], Any, list[dict[str, Any]]]]:
    """(table 'when', case maker, candidate configs) per bucket; ``tma``: add tensor-descriptor
    kernel candidates to the fp16/bf16 matmul/linear buckets."""
    ew_tiled = [{"BLOCK_M": m, "BLOCK_N": n, "num_warps": w}
                for m, n, w in itertools.product([1, 2, 4, 8, 16, 32], [256, 512, 1024, 2048], [4, 8])
                if m * n <= 32768]
    ew_flat = [{"BLOCK": b, "num_warps": w} for b, w in itertools.product([1024, 2048, 4096, 8192, 16384], [4, 8, 16])]
    out: list = []
    if op in ("broadcast", "add"):
        for dt in ("float32", "bfloat16"):
            # tiny tensors (launch latency dominates: enough programs matter more than big blocks),
            # small, medium (L2-resident), large (HBM-bound)
            for lo, hi, rows, cols in [(0, 2**17, 256, 256), (2**17 + 1, 2**20, 512, 1024),
                                       (2**20 + 1, 2**24 - 1, 2048, 4096), (2**24, 2**62, 8192, 8192)]:
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
        tiles = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4),
                 (128, 256, 32, 8, 4), (64, 256, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                 (64, 64, 64, 4, 4), (64, 128, 128, 4, 3)]
        # few rows: enough output tiles to fill the SMs, long K steps to keep loads in flight
        skinny = [(16, 32, 256, 4, 4), (16, 64, 128, 4, 5), (16, 64, 256, 4, 3), (16, 128, 128, 4, 4),
                  (32, 32, 256, 4, 4), (32, 64, 128, 4, 5), (64, 32, 256, 4, 4), (64, 64, 128, 4, 4),
                  (64, 64, 256, 4, 3), (64, 128, 128, 4, 3)]
        # fp32 with IEEE dot runs on the FMA units: smaller K steps, more warps
        ieee = [(128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 4), (128, 128, 16, 8, 4),
                (64, 64, 32, 4, 4), (128, 256, 16, 8, 3), (64, 256, 32, 8, 3), (256, 64, 32, 8, 3)]

        # matmul_tma_kernel (sm90+): (BM, BN, BK, warps, stages, persistent, epilogue subtile). Each
        # compiles for sm90 (matmul and linear + bias + gelu) within the 227 KiB of shared memory a
        # block may use: a persistent kernel keeps C's staging buffer beside the pipeline's, which
        # the subtiled epilogue halves (so 128x256x64 fits 4 stages). With 128 fp32 accumulators a
        # thread, linear's bias + gelu epilogue spills registers (ptxas) unless stored in halves.
        tma_tiles = [(128, 256, 64, 8, 3, 0, 0), (128, 256, 64, 8, 4, 0, 0), (128, 256, 64, 8, 4, 0, 1),
                     (256, 128, 64, 8, 4, 0, 1), (128, 128, 64, 8, 4, 0, 0), (128, 128, 128, 8, 3, 0, 0),
                     (64, 256, 64, 4, 4, 0, 1), (128, 256, 64, 8, 3, 1, 0), (128, 256, 64, 8, 3, 1, 1),
                     (128, 256, 64, 8, 4, 1, 1), (256, 128, 64, 8, 3, 1, 0), (256, 128, 64, 8, 4, 1, 1),
                     (128, 128, 64, 8, 4, 1, 0), (128, 128, 64, 8, 5, 1, 1), (128, 128, 128, 8, 3, 1, 1),
                     (64, 256, 64, 4, 4, 1, 1)]
        # M = 64: one 64-row block (wgmma's smallest), N / BN tiles, fewer than the SMs: not persistent
        tma_skinny = [(64, 64, 128, 4, 4, 0, 0), (64, 128, 128, 4, 3, 0, 0), (64, 64, 256, 4, 3, 0, 0),
                      (64, 128, 64, 4, 4, 0, 0)]

        # split-K for few rows (BM, BN, BK, warps, stages, splits): every row in one block, B streamed
        # by tiles x splits programs; the fp32 partials are summed by a second kernel
        split = [(64, 64, 128, 4, 4, 4), (64, 64, 128, 4, 4, 2), (64, 128, 128, 4, 3, 4), (64, 64, 64, 4, 4, 8),
                 (16, 64, 128, 4, 5, 2), (32, 64, 128, 4, 4, 4)]
        split_ieee = [(64, 64, 32, 4, 4, 4), (64, 64, 32, 8, 3, 8), (32, 64, 64, 4, 4, 4), (64, 128, 32, 8, 3, 4)]

        def configs(rows: list[tuple[int, ...]]) -> list[dict[str, Any]]:
            return [{"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "num_warps": w, "num_stages": st,
                     **({"SPLIT_K": r[0]} if r else {})} for m, n, k, w, st, *r in rows]

        def tma_configs(rows: list[tuple[int, ...]]) -> list[dict[str, Any]]:
            """TMA kernel configs; none where the backend has no tensor descriptors."""
            flags = ("TMA", "PERSISTENT", "EPILOGUE_SUBTILE")
            return [{**configs([r[:5]])[0], **{f: True for f, on in zip(flags, (1, *r[5:])) if on}}
                    for r in rows] if tma else []

        for dt in ("bfloat16", "float32"):
            d = getattr(torch, dt)
            dts = [dt] + (["float16"] if dt == "bfloat16" else [])
            big = configs(tiles) + tma_configs(tma_tiles)
            buckets = [({"m_max": 16}, (16, 4096, 4096), configs(skinny + split)),
                       ({"m_max": 64}, (64, 4096, 4096), configs(skinny + split) + tma_configs(tma_skinny)),
                       ({"k_max": 256}, (4096, 4096, 256), big), ({"k_max": 1024}, (4096, 4096, 1024), big),
                       ({"m_max": 2048}, (2048, 2048, 2048), big), ({}, (4096, 4096, 4096), big)]
            if dt == "float32":  # fp32 follows torch's default (IEEE): one table for all sizes
                buckets = [({"m_max": 64}, (64, 4096, 4096), configs(skinny + ieee + split_ieee)),
                           ({}, (4096, 4096, 4096), configs(ieee))]
            for when, (M, N, K), cands in buckets:
                def mkm(M=M, N=N, K=K, d=d):
                    if op == "linear":  # x (M, K), weight (N, K): B is K-contiguous; bias + gelu epilogue
                        return (torch.randn(M, K, device=dev).to(d), torch.randn(N, K, device=dev).to(d),
                                torch.randn(N, device=dev).to(d), "gelu")
                    return torch.randn(M, K, device=dev).to(d), torch.randn(K, N, device=dev).to(d)
                out.append(({"dtype": dts, **when}, mkm, cands))
    return out


def bucket_rules(when: dict[str, Any], shapes: list[list[int]], torch_ms: float,
                 best: tuple[float, dict[str, Any]] | None,
                 best_pointer: tuple[float, dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The table rules of one swept bucket from (ms, config) of its fastest config and of its
    fastest pointer-kernel config (no ``"TMA"``). A TMA winner gives ``{"variant": "tma", **when}``
    (only the TMA lookup matches it) followed by the pointer config under ``when``, for calls
    that cannot use TMA (misaligned rows, transposed A, ...); a pointer winner gives one rule."""
    if best is None:
        return []

    def measured(ms: float) -> dict[str, Any]:
        m = {"shapes": shapes, "ms": round(ms, 5), "torch_ms": round(torch_ms, 5),
             "speedup": round(torch_ms / ms, 3), "best_ms": round(best[0], 5)}
        if best_pointer is not None:
            m["pointer_ms"] = round(best_pointer[0], 5)
        return m

    rules = []
    if best[1].get("TMA"):
        rules.append({"when": {"variant": "tma", **when}, "config": best[1], "measured": measured(best[0])})
    if best_pointer is not None:
        rules.append({"when": dict(when), "config": best_pointer[1], "measured": measured(best_pointer[0])})
    return rules


def sweep(backend_name: str, op_name: str, reps: int) -> dict[str, Any]:
    backend = xkernels.get_backend(backend_name)
    backend.require_available()
    op = getattr(xkernels.ops, op_name)
    dev = backend.device_type
    arch = backend.arch()
    rules, report = [], []
    for when, mk, candidates in _buckets(op_name, dev, backend.tensor_descriptors()):
        args = mk()
        from xkernels.ops.matmul import reference_linear

        torch_fn = {"broadcast": lambda a, b: a + b, "add": torch.add, "matmul": torch.matmul,
                    "linear": reference_linear}[op_name]
        ref = torch_fn(*args)
        torch_ms = _time_ms(backend, lambda: torch_fn(*args), reps)
        best = best_pointer = None
        with xkernels.use_backend(backend.name):
            for cfg in candidates:
                try:
                    with tuning.force(cfg):
                        if cfg.get("TMA") and not op.explain(*args).config.get("TMA"):
                            raise ValueError("the call does not take the TMA kernel under this config")
                        got = op(*args)
                        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)
                        ms = _time_ms(backend, lambda: op(*args), reps)
                except Exception as exc:  # a config that fails to compile or is wrong is skipped
                    report.append({"when": when, "config": cfg, "error": repr(exc)[:200]})
                    continue
                report.append({"when": when, "config": cfg, "ms": ms, "torch_ms": torch_ms})
                if best is None or ms < best[0]:
                    best = (ms, cfg)
                if not cfg.get("TMA") and (best_pointer is None or ms < best_pointer[0]):
                    best_pointer = (ms, cfg)
        shape = [list(a.shape) for a in args if isinstance(a, torch.Tensor)]
        rules.extend(bucket_rules(when, shape, torch_ms, best, best_pointer))
        if best is not None:
            pointer = f", best pointer kernel {best_pointer[0]:.4f} ms" if best_pointer and best[1].get("TMA") else ""
            print(f"{op_name} {when} {shape}: best {best[1]} {best[0]:.4f} ms{pointer}, torch {torch_ms:.4f} ms "
                  f"({torch_ms / best[0]:.2f}x)", flush=True)
    props = backend.properties()
    source = (f"python -m xkernels.tune --backend {backend_name} --op {op_name}; {props.name}; "
              f"{datetime.date.today()}; torch {torch.__version__}; triton {_triton_version()}")
    return {"table": {"op": op_name, "backend": backend_name, "source": source, "archs": {arch: rules}},
            "report": report}


def install(table: dict[str, Any], path: Path) -> None:
    """Merge ``table``'s arch rules into the table at ``path``: the swept arch is replaced, the
    other archs (e.g. ``default``) stay; the source line names the sweep."""
    old = json.loads(path.read_text()) if path.exists() else {"op": table["op"], "backend": table["backend"], "archs": {}}
    old["archs"].update(table["archs"])
    old["source"] = table["source"] + ". Other archs: kept from the previous table."
    path.write_text(json.dumps(old, indent=1) + "\n")


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
    p.add_argument("--reps", type=int, default=0, help="timed calls per config (default: a time budget)")
    p.add_argument("--install", type=Path, default=None, metavar="TABLE_DIR",
                   help="also merge the swept arch's rules into TABLE_DIR/<op>.json (other archs kept), "
                        "e.g. ops/tuning/cuda")
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
        if a.install is not None:
            install(res["table"], a.install / f"{op}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
