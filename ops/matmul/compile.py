"""``matmul`` / ``linear``: their compile cases for the offline Ascend check (``Op.compile_cases``).

A call's class is a dict of table conditions (``_MatmulBase.compile_classes``: dtype, activation,
bias; linear's also ``residual``, compiled with a full residual: the residual entry points). For
each class the op's rules are walked in ``xkernels.tuning.lookup``'s order: each rule whose
non-shape conditions admit the class is compiled for it, until a rule without shape conditions
(``m``/``n``/``k``/``batch`` and their ``_min``/``_max``) ends the walk. A class no such
rule ends reaches the wave model: its candidates (the table's ``"candidates"`` groups, else
``BUILTIN_CANDIDATES``) are compiled for it. Every ``"candidates"`` group is compiled for each
class it admits. A rule no class reaches is a note (never selected), not compiled. A
shape-conditioned entry is compiled at a shape inside its range. Each entry is compiled on the
layouts ``op.compile_layouts`` yields; entries with ``SPLIT_K`` on one where the split applies
(the partial-sums kernel and ``splitk_reduce_kernel`` are two cases).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from xkernels import tuning
from xkernels.compile_cases import CompileCase, CompileTarget, meta, shown

MM_DTYPES = ("float16", "bfloat16", "float32")
SHAPE_FIELDS = ("m", "n", "k", "batch")


def split_when(when: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(class conditions, shape conditions)`` of a rule's ``when``."""
    shape = {k: v for k, v in when.items() if k.removesuffix("_min").removesuffix("_max") in SHAPE_FIELDS}
    return {k: v for k, v in when.items() if k not in shape}, shape


@dataclass
class Entry:
    where: str  # "linear.json [Ascend910B] rule 2", "... candidate 0", "built-in candidate 3"
    config: dict[str, Any]
    shape_when: dict[str, Any]
    classes: list[dict[str, Any]]


def mm_entries(op: Any, target: CompileTarget) -> tuple[list[Entry], list[str]]:
    """The entries a call of ``op`` on ``target.soc`` can run, each with the classes it serves, and
    a line for each rule that no class reaches (see the module doc)."""
    from xkernels.ops.matmul.config import BUILTIN_CANDIDATES

    sections = target.sections(op.name)
    rules = [Entry(f"{where} rule {i}", r["config"], split_when(r.get("when", {}))[1], [])
             for where, s in sections for i, r in enumerate(s["archs"])]
    conds = [split_when(r.get("when", {}))[0] for _, s in sections for r in s["archs"]]
    groups = [(f"{where} candidates {i}", g) for where, s in sections for i, g in enumerate(s["candidates"])]
    cands = [(split_when(g.get("when", {}))[0],
              Entry(f"{where}, config {j}", {k: v for k, v in c.items() if k != "cost"},
                    split_when(g.get("when", {}))[1], []))
             for where, g in groups for j, c in enumerate(g["configs"])]
    builtin = [Entry(f"built-in candidate {j} (matmul_config.py)", dict(c), {}, [])
               for j, c in enumerate(BUILTIN_CANDIDATES)]
    for cls in op.compile_classes():
        for entry, cond in zip(rules, conds):
            if tuning.matches(cond, cls):
                entry.classes.append(cls)
                if not entry.shape_when:
                    break
        else:  # no rule takes every call of this class: the wave model is reachable
            if not any(tuning.matches(cond, cls) for cond, _ in cands):
                for entry in builtin:
                    entry.classes.append(cls)
        for cond, entry in cands:  # a table's candidates are compiled wherever they apply
            if tuning.matches(cond, cls):
                entry.classes.append(cls)
    never = [f"{op.name} on {target.soc}: {e.where} {e.config} is never selected (earlier rules take every call "
             f"it admits)" for e in rules if not e.classes]
    return [e for e in rules + [e for _, e in cands] + builtin if e.classes], never


def dim(name: str, default: int, shape_when: dict[str, Any]) -> int:
    """``default`` moved into the entry's range for dim ``name`` (or its exact value)."""
    if name in shape_when:
        return int(shape_when[name])
    lo, hi = shape_when.get(f"{name}_min", 1), shape_when.get(f"{name}_max", default)
    return max(int(lo), min(default, int(hi)))


def _sizes(cfg: dict[str, Any], shape_when: dict[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    bm, bn, bk = (int(cfg.get(k, 64)) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    M, N, K = dim("m", 8 * bm, shape_when), dim("n", 8 * bn, shape_when), dim("k", 8 * bk, shape_when)
    return bm, bn, bk, M, N, K, int(cfg.get("SPLIT_K") or 1)


def matmul_layouts(cfg: dict[str, Any], shape_when: dict[str, Any], cls: dict[str, Any],
                   dtype: torch.dtype) -> Iterator[tuple[str, tuple, dict]]:
    """matmul's forward and backward-GEMM layouts (grad_a = grad @ b.T, grad_b = a.T @ grad),
    a batched one and, with SPLIT_K, a one-tile call that splits."""
    bm, bn, bk, M, N, K, split = _sizes(cfg, shape_when)
    one_batch = dim("batch", 1, shape_when) == 1 and shape_when.get("batch_min", 1) <= 1
    if one_batch:
        yield "contiguous", (meta((M, K), dtype), meta((K, N), dtype)), {}
        yield "A transposed", (meta((K, M), dtype).t(), meta((K, N), dtype)), {}
        yield "B transposed", (meta((M, K), dtype), meta((N, K), dtype).t()), {}
        yield "A and B transposed", (meta((K, M), dtype).t(), meta((N, K), dtype).t()), {}
    if dim("batch", 6, shape_when) == 6 and shape_when.get("batch_max", 6) >= 6:
        yield "batched, broadcast batch", (meta((2, 1, M, K), dtype), meta((3, K, N), dtype)), {}
    if split > 1 and one_batch:  # one output tile, K long enough for every split
        m, n, k = dim("m", bm, shape_when), dim("n", bn, shape_when), dim("k", 4 * bk * split, shape_when)
        yield "split-K", (meta((m, k), dtype), meta((k, n), dtype)), {}


def linear_layouts(cfg: dict[str, Any], shape_when: dict[str, Any], cls: dict[str, Any],
                   dtype: torch.dtype) -> Iterator[tuple[str, tuple, dict]]:
    """linear's ``x @ W.T`` with the class's bias, activation (and residual) and, with SPLIT_K, a
    split call."""
    bm, bn, bk, M, N, K, split = _sizes(cfg, shape_when)
    act = None if cls["activation"] == "none" else cls["activation"]
    res = bool(cls.get("residual"))
    epilogue = (" + b" if cls["bias"] else "") + f", {act}" + (" + residual" if res else "")

    def args(m: int, n: int, k: int) -> tuple:
        return (meta((m, k), dtype), meta((n, k), dtype), meta((n,), dtype) if cls["bias"] else None, act)

    def kwargs(m: int, n: int) -> dict:
        return {"residual": meta((m, n), dtype)} if res else {}

    yield f"x @ W.T{epilogue}", args(M, N, K), kwargs(M, N)
    if split > 1:
        m, n = dim("m", bm, shape_when), dim("n", bn, shape_when)
        yield f"split-K, x @ W.T{epilogue}", args(m, n, dim("k", 4 * bk * split, shape_when)), kwargs(m, n)


def mm_cases(op: Any, target: CompileTarget) -> Iterator[CompileCase]:
    entries, never = mm_entries(op, target)
    target.notes.extend(never)
    soc = target.soc
    for entry in entries:
        for cls in entry.classes:
            dtype = getattr(torch, cls["dtype"])
            layouts = list(op.compile_layouts(entry.config, entry.shape_when, cls, dtype))
            if not layouts:
                target.notes.append(f"{op.name} on {soc}: {entry.where} ({cls}): no layout of the check falls in "
                                    f"its shape range {entry.shape_when}; not compiled")
            for label, args, kwargs in layouts:
                with tuning.force(entry.config):
                    call = op.check(*args, **kwargs)
                    plan = op.make_plan(call, target.backend)
                out = meta(tuple(call.batch) + (call.a.shape[-2], call.b.shape[-1]), dtype)
                name = f"{shown(plan.config)}|{label}|{entry.where}"
                if label.startswith("split-K") and plan.split_k == 1:
                    target.notes.append(f"{op.name} on {soc}: {entry.where} sets SPLIT_K but no one-tile call "
                                        f"splits K ({label}); only its unsplit path is compiled")
                    continue
                if plan.split_k > 1:
                    ws = meta((plan.split_k, *out.shape[-2:]), torch.float32)
                    rt = plan.args(call.a, call.b, ws, None, call.slope)
                    yield target.case(op.name, plan.jit_fn, rt, plan.constexprs, cls["dtype"], name + " (partials)")
                    rt = plan.reduce_args(ws, out, call.bias, call.slope, call.residual)
                    yield target.case(op.name, plan.reduce_jit_fn, rt, plan.reduce_launcher.constexprs,
                                      cls["dtype"], name + " (reduction)")
                    continue
                rt = plan.args(call.a, call.b, out, call.bias, call.slope, call.residual)
                yield target.case(op.name, plan.jit_fn, rt, plan.constexprs, cls["dtype"], name)
