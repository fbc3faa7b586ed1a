"""The list of kernel compilations that prove the npu tuning tables fit the hardware.

Every op × every npu tuning entry × every kernel dtype × every SoC × the layouts that entry
serves becomes one :class:`CompileCase`. A case is built by the op's own planning code (the same
``BinaryPlan``/``MatmulPlan`` a real call makes, with the entry forced and the SoC's launch
geometry), on ``meta`` tensors, so the signature and constexprs are exactly what a device launch
would compile, including Triton's specialization of integer arguments equal to 1 (which changes
the memory plan). ``python -m xkernels.npu_compile`` compiles them with triton-ascend and plans
their memory with bishengir-compile.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xkernels import tuning
from xkernels.backends import npu as npu_backend

OPS = ("broadcast", "add", "matmul", "linear")
EW_DTYPES = ("float16", "bfloat16", "float32", "int32", "int64")
MM_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class CompileCase:
    op: str
    kernel: Callable[..., Any]  # the @triton.jit JITFunction
    signature: dict[str, str]  # every argument -> Triton type ("*fp32", "i32", ...) or "constexpr"
    constants: dict[str, object]  # values of constexpr arguments and of ints specialized to 1
    dtype: str
    config: str  # label: entry config | layout
    soc: str


class _Geometry(npu_backend.NpuBackend):
    """The npu backend's rules for one SoC, from the datasheet core counts (no device needed)."""

    def __init__(self, soc: str) -> None:
        self.soc = soc
        sheet = npu_backend.DATASHEET[soc]
        self.cores = (int(sheet["cube_cores"].value), int(sheet["vector_cores"].value))

    def max_programs(self, unit: Any = "vector", device: Any = None) -> int:
        return min(self.cores[0] if unit == "cube" else self.cores[1], npu_backend.MAX_GRID)

    def arch(self, device: Any = None) -> str:
        return self.soc


_TL = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64"}


def _signature(jit_fn: Any, args: tuple[Any, ...], constexprs: dict[str, Any]) -> tuple[dict[str, str], dict]:
    names = list(jit_fn.arg_names)
    sig: dict[str, str] = {}
    consts: dict[str, object] = dict(constexprs)
    for name, v in zip(names, args):
        if isinstance(v, torch.Tensor):
            sig[name] = "*" + _TL[v.dtype]
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int):
            sig[name] = "i32" if -(2**31) <= v < 2**31 else "i64"
            if v == 1:  # Triton specializes ints equal to 1 into constants at launch
                consts[name] = 1
        else:
            sig[name] = "fp32"
    for name in names[len(args):]:
        sig[name] = "constexpr"
    return sig, consts


def _entries(op: str, soc: str) -> list[dict[str, Any]]:
    """Every rule of the npu tables that can apply on ``soc`` (SoC, family, default keys)."""
    from xkernels.dispatch import get_backend
    from xkernels.ops.binary import FLAT_DEFAULT, TILED_DEFAULT
    from xkernels.ops.matmul import MATMUL_DEFAULT
    from xkernels.registry import registry

    rules: list[dict[str, Any]] = []
    keys = [soc, npu_backend.soc_family(soc), "default"]
    for d in registry.tuning_dirs(get_backend("npu")):  # plugin-added tables are checked too
        path = Path(d) / f"{op}.json"
        if path.exists():
            archs = json.loads(path.read_text())["archs"]
            rules += [r for k in keys for r in archs.get(k, [])]
    if op in ("matmul", "linear"):
        rules.append({"when": {}, "config": MATMUL_DEFAULT, "label": "op default"})
    else:
        rules.append({"when": {"variant": "flat"}, "config": FLAT_DEFAULT, "label": "op default"})
        rules.append({"when": {"variant": "tiled"}, "config": TILED_DEFAULT, "label": "op default"})
    return rules


def _meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _binary_layouts(op: str, cfg: dict[str, Any], variant: str, dtype: torch.dtype) -> Iterator[tuple[str, tuple, dict]]:
    if variant == "flat":
        n = max(int(cfg.get("BLOCK", 2048)), 1) * 64
        yield "contiguous", (_meta((n,), dtype), _meta((n,), dtype)), {}
        if op == "add":
            yield "scalar y, alpha", (_meta((n,), dtype), 3), {"alpha": 2}
            yield "int64 index", (_meta((2**31 + 2**20,), dtype), _meta((2**31 + 2**20,), dtype)), {}
    else:
        bm, bn = int(cfg.get("BLOCK_M", 8)), int(cfg.get("BLOCK_N", 256))
        rows, cols = bm * 64, bn * 4
        yield "row bias", (_meta((rows, cols), dtype), _meta((cols,), dtype)), {}
        yield "mask [B,1,1,S] over [B,H,S,S]", (_meta((2, 4, rows // 8 or 1, cols), dtype),
                                                _meta((2, 1, 1, cols), dtype)), {}
        if op == "add":
            yield "both sides broadcast", (_meta((rows, 1, cols), dtype), _meta((1, 4, cols), dtype)), {"alpha": 2}


def _matmul_layouts(op: str, cfg: dict[str, Any], when: dict[str, Any], dtype: torch.dtype) -> Iterator[tuple]:
    M, N, K = int(cfg.get("BLOCK_M", 64)) * 8, int(cfg.get("BLOCK_N", 64)) * 8, int(cfg.get("BLOCK_K", 32)) * 8
    if op == "matmul":
        yield "contiguous", (_meta((M, K), dtype), _meta((K, N), dtype)), {}
        yield "A transposed", (_meta((K, M), dtype).t(), _meta((K, N), dtype)), {}
        yield "batched, broadcast batch", (_meta((2, 1, M, K), dtype), _meta((3, K, N), dtype)), {}
        return
    acts = when.get("activation") or [None]
    for act in acts if isinstance(acts, list) else [acts]:
        act = None if act == "none" else act
        yield f"x @ W.T + b, {act}", (_meta((M, K), dtype), _meta((N, K), dtype), _meta((N,), dtype), act), {}


def collect_cases(socs: list[str] | None = None, ops: list[str] | None = None) -> list[CompileCase]:
    """Every (op, npu tuning entry, dtype, layout, SoC) compilation the tables imply."""
    import xkernels.ops as xops

    socs = socs or [s for s in npu_backend.DATASHEET if s != "Ascend910B1"]
    cases: list[CompileCase] = []
    for soc in socs:
        geometry = _Geometry(soc)
        for op_name in ops or OPS:
            op = getattr(xops, op_name)
            for rule in _entries(op_name, soc):
                when, cfg = rule.get("when", {}), rule["config"]
                kernel_dtypes = MM_DTYPES if op_name in ("matmul", "linear") else EW_DTYPES
                want = when.get("dtype")
                dtypes = [d for d in kernel_dtypes if want is None or d in (want if isinstance(want, list) else [want])]
                for dname in dtypes:
                    dtype = getattr(torch, dname)
                    if op_name in ("matmul", "linear"):
                        layouts = _matmul_layouts(op_name, cfg, when, dtype)
                    else:
                        layouts = _binary_layouts(op_name, cfg, when.get("variant", "tiled"), dtype)
                    for label, args, kwargs in layouts:
                        with tuning.force(cfg):
                            call = op.check(*args, **kwargs)
                            plan = op.make_plan(call, geometry)
                        if op_name in ("matmul", "linear"):
                            out = _meta(tuple(call.batch) + (call.a.shape[-2], call.b.shape[-1]), dtype)
                            rt = plan.args(call.a, call.b, out, call.bias, call.slope)
                        else:
                            out = _meta(tuple(call.shape), call.dtype)
                            rt = plan.args(call.x, call.y, out, call.alpha)
                        sig, consts = _signature(plan.jit_fn, rt, plan.constexprs)
                        shown = ",".join(f"{k}={v}" for k, v in plan.config.items() if k != "INDEX_64")
                        idx = " int64-index" if plan.constexprs.get("INDEX_64") else ""
                        cases.append(CompileCase(op_name, plan.jit_fn, sig, consts, dname,
                                                 f"{shown}|{label}{idx}", soc))
    return cases
