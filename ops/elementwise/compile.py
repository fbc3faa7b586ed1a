"""``add`` / ``broadcast``: their compile cases for the offline Ascend check (``Op.compile_cases``).

Every rule of the op's npu table sections (and the op defaults), for each kernel dtype the rule
admits, on each layout its variant serves (``BinaryOp.compile_layouts``), planned by the op's own
``check`` and ``make_plan`` on meta tensors with the SoC's launch geometry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from xkernels import tuning
from xkernels.compile_cases import CompileCase, CompileTarget, meta, shown

EW_DTYPES = ("float16", "bfloat16", "float32", "int32", "int64")


def binary_entries(op: Any, target: CompileTarget) -> list[dict[str, Any]]:
    """The op's npu table rules, then its built-in default per variant (``op.default_configs``)."""
    rules = [r for _, s in target.sections(op.name) for r in s["archs"]]
    for variant, config in op.default_configs.items():
        rules.append({"when": {"variant": variant}, "config": config})
    return rules


def base_layouts(cfg: dict[str, Any], variant: str, dtype: torch.dtype) -> Iterator[tuple[str, tuple, dict]]:
    """(label, args, kwargs) of the calls both ops make on a ``variant`` entry."""
    if variant == "flat":
        n = max(int(cfg.get("BLOCK", 2048)), 1) * 64
        yield "contiguous", (meta((n,), dtype), meta((n,), dtype)), {}
    else:
        bm, bn = int(cfg.get("BLOCK_M", 8)), int(cfg.get("BLOCK_N", 256))
        rows, cols = bm * 64, bn * 4
        yield "row bias", (meta((rows, cols), dtype), meta((cols,), dtype)), {}
        yield "mask [B,1,1,S] over [B,H,S,S]", (meta((2, 4, rows // 8 or 1, cols), dtype),
                                                meta((2, 1, 1, cols), dtype)), {}


def add_layouts(cfg: dict[str, Any], variant: str, dtype: torch.dtype) -> Iterator[tuple[str, tuple, dict]]:
    """``add``'s: the shared ones, then a Python-number operand with alpha and int64 indexing
    (flat), or both sides broadcast (tiled)."""
    if variant == "flat":
        n = max(int(cfg.get("BLOCK", 2048)), 1) * 64
        yield from base_layouts(cfg, variant, dtype)
        yield "scalar y, alpha", (meta((n,), dtype), 3), {"alpha": 2}
        yield "int64 index", (meta((2**31 + 2**20,), dtype), meta((2**31 + 2**20,), dtype)), {}
    else:
        bm, bn = int(cfg.get("BLOCK_M", 8)), int(cfg.get("BLOCK_N", 256))
        rows, cols = bm * 64, bn * 4
        yield from base_layouts(cfg, variant, dtype)
        yield "both sides broadcast", (meta((rows, 1, cols), dtype), meta((1, 4, cols), dtype)), {"alpha": 2}


def binary_cases(op: Any, target: CompileTarget) -> Iterator[CompileCase]:
    for rule in binary_entries(op, target):
        when, cfg = rule.get("when", {}), rule["config"]
        want = when.get("dtype")
        dtypes = [d for d in EW_DTYPES if want is None or d in (want if isinstance(want, list) else [want])]
        for dname in dtypes:
            dtype = getattr(torch, dname)
            for label, args, kwargs in op.compile_layouts(cfg, when.get("variant", "tiled"), dtype):
                with tuning.force(cfg):
                    call = op.check(*args, **kwargs)
                    plan = op.make_plan(call, target.backend)
                rt = plan.args(call.x, call.y, meta(tuple(call.shape), call.dtype), call.alpha)
                idx = " int64-index" if plan.constexprs.get("INDEX_64") else ""
                yield target.case(op.name, plan.jit_fn, rt, plan.constexprs, dname, f"{shown(plan.config)}|{label}{idx}")
