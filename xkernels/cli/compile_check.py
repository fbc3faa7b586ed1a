"""The list of kernel compilations that prove the npu tuning tables fit the hardware.

For every SoC of ``backends/npu_socs.json`` (Atlas A2 and A3), every op and every npu tuning entry
that a call on that SoC can select, each kernel dtype, epilogue and layout the entry serves
becomes one :class:`CompileCase`. A case is built by the op's own planning code (the same
``BinaryPlan``/``MatmulPlan`` a real call makes, with the entry forced and the SoC's launch
geometry), on ``meta`` tensors, so the signature and constexprs are exactly what a device launch
would compile, including Triton's specialization of integer arguments equal to 1 (which changes
the memory plan). ``python -m xkernels.npu_compile`` compiles them with triton-ascend and plans
their memory with bishengir-compile.

Which matmul/linear entries, for which calls. A call's class is (dtype, activation, bias); the
activations are ``xkernels.ops.matmul.ACTIVATIONS``, so a new epilogue is covered without an
edit here. For each class the rules are walked in ``xkernels.tuning.lookup``'s order (plugin and
user tables first; the SoC's key, its family, the families it falls back to, ``default``): each
rule whose dtype/activation/bias conditions admit the class is compiled for it, until a rule
without shape conditions (``m``/``n``/``k``/``batch`` and their ``_min``/``_max``) ends the walk.
A class no such rule ends reaches the wave model: its candidates (the table's ``"candidates"``
groups, else ``BUILTIN_CANDIDATES``) are compiled for it. Every ``"candidates"`` group is compiled
for each class it admits in any case. A rule that no class reaches is listed by :func:`collect`
as never selected, not compiled. A shape-conditioned entry is compiled at a shape inside its
range (the largest effective tile). Entries with ``SPLIT_K`` also get a layout where the split
applies: the partial-sums kernel and ``splitk_reduce_kernel`` (bias and activation) are cases.
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
SHAPE_FIELDS = ("m", "n", "k", "batch")


@dataclass(frozen=True)
class CompileCase:
    op: str
    kernel: Callable[..., Any]  # the @triton.jit JITFunction
    signature: dict[str, str]  # every argument -> Triton type ("*fp32", "i32", ...) or "constexpr"
    constants: dict[str, object]  # values of constexpr arguments and of ints specialized to 1
    dtype: str
    config: str  # label: entry config | layout
    soc: str


def default_socs() -> list[str]:
    """Every SoC of backends/npu_socs.json (the targets bishengir-compile 1.2.0 accepts for A2/A3)."""
    return list(npu_backend.SOCS)


class _Geometry(npu_backend.NpuBackend):
    """The npu backend's rules for one SoC, from the SoC table's core counts (no device needed)."""

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


def _sections(op: str, soc: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, table)`` in ``xkernels.tuning.lookup``'s order: tuning directories (plugins and
    the user's cache first), then the SoC's table keys, then ``default``."""
    from xkernels.dispatch import get_backend
    from xkernels.registry import registry

    for d in registry.tuning_dirs(get_backend("npu")):
        path = Path(d) / f"{op}.json"
        if path.exists():
            table = json.loads(path.read_text())
            for key in [*npu_backend.table_keys(soc), "default"]:
                yield f"{path.name} [{key}]", {"archs": table.get("archs", {}).get(key, []),
                                               "candidates": table.get("candidates", {}).get(key, [])}


def _meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _shown(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items() if k != "INDEX_64")


# --------------------------------------------------------------------------- broadcast / add


def _binary_entries(op: str, soc: str) -> list[dict[str, Any]]:
    from xkernels.ops.elementwise.binary import FLAT_DEFAULT, TILED_DEFAULT

    rules = [r for _, s in _sections(op, soc) for r in s["archs"]]
    rules.append({"when": {"variant": "flat"}, "config": FLAT_DEFAULT})
    rules.append({"when": {"variant": "tiled"}, "config": TILED_DEFAULT})
    return rules


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


def _binary_cases(op_name: str, soc: str, geometry: _Geometry) -> Iterator[CompileCase]:
    import xkernels.ops as xops

    op = getattr(xops, op_name)
    for rule in _binary_entries(op_name, soc):
        when, cfg = rule.get("when", {}), rule["config"]
        want = when.get("dtype")
        dtypes = [d for d in EW_DTYPES if want is None or d in (want if isinstance(want, list) else [want])]
        for dname in dtypes:
            dtype = getattr(torch, dname)
            for label, args, kwargs in _binary_layouts(op_name, cfg, when.get("variant", "tiled"), dtype):
                with tuning.force(cfg):
                    call = op.check(*args, **kwargs)
                    plan = op.make_plan(call, geometry)
                rt = plan.args(call.x, call.y, _meta(tuple(call.shape), call.dtype), call.alpha)
                sig, consts = _signature(plan.jit_fn, rt, plan.constexprs)
                idx = " int64-index" if plan.constexprs.get("INDEX_64") else ""
                yield CompileCase(op_name, plan.jit_fn, sig, consts, dname, f"{_shown(plan.config)}|{label}{idx}", soc)


# --------------------------------------------------------------------------- matmul / linear


def _split_when(when: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(class conditions, shape conditions)`` of a rule's ``when``."""
    shape = {k: v for k, v in when.items() if k.removesuffix("_min").removesuffix("_max") in SHAPE_FIELDS}
    return {k: v for k, v in when.items() if k not in shape}, shape


def mm_classes(op: str) -> list[dict[str, Any]]:
    """The (dtype, activation, bias) classes of ``op``'s calls, as table keys."""
    from xkernels.ops.matmul import ACTIVATIONS

    acts = list(ACTIVATIONS) if op == "linear" else [None]
    biases = (True, False) if op == "linear" else (False,)
    return [{"dtype": d, "activation": a or "none", "bias": b} for d in MM_DTYPES for a in acts for b in biases]


@dataclass
class _Entry:
    where: str  # "linear.json [Ascend910B] rule 2", "... candidate 0", "built-in candidate 3"
    config: dict[str, Any]
    shape_when: dict[str, Any]
    classes: list[dict[str, Any]]


def mm_entries(op: str, soc: str) -> tuple[list[_Entry], list[str]]:
    """The matmul/linear entries a call on ``soc`` can run, each with the classes it serves, and
    a line for each rule that no class reaches (see the module doc)."""
    from xkernels.ops.matmul.config import BUILTIN_CANDIDATES

    sections = list(_sections(op, soc))
    rules = [_Entry(f"{where} rule {i}", r["config"], _split_when(r.get("when", {}))[1], [])
             for where, s in sections for i, r in enumerate(s["archs"])]
    conds = [_split_when(r.get("when", {}))[0] for _, s in sections for r in s["archs"]]
    groups = [(f"{where} candidates {i}", g) for where, s in sections for i, g in enumerate(s["candidates"])]
    cands = [(_split_when(g.get("when", {}))[0],
              _Entry(f"{where}, config {j}", {k: v for k, v in c.items() if k != "cost"},
                     _split_when(g.get("when", {}))[1], []))
             for where, g in groups for j, c in enumerate(g["configs"])]
    builtin = [_Entry(f"built-in candidate {j} (matmul_config.py)", dict(c), {}, [])
               for j, c in enumerate(BUILTIN_CANDIDATES)]
    for cls in mm_classes(op):
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
    never = [f"{op} on {soc}: {e.where} {e.config} is never selected (earlier rules take every call it admits)"
             for e in rules if not e.classes]
    return [e for e in rules + [e for _, e in cands] + builtin if e.classes], never


def _dim(name: str, default: int, shape_when: dict[str, Any]) -> int:
    """``default`` moved into the entry's range for dim ``name`` (or its exact value)."""
    if name in shape_when:
        return int(shape_when[name])
    lo, hi = shape_when.get(f"{name}_min", 1), shape_when.get(f"{name}_max", default)
    return max(int(lo), min(default, int(hi)))


def _mm_layouts(op: str, cfg: dict[str, Any], shape_when: dict[str, Any], cls: dict[str, Any],
                dtype: torch.dtype) -> Iterator[tuple[str, tuple, dict]]:
    """(label, args, kwargs) of the calls ``cfg`` serves for ``cls``: for matmul the forward and
    backward-GEMM layouts (grad_a = grad @ b.T, grad_b = a.T @ grad) and a batched one."""
    bm, bn, bk = (int(cfg.get(k, 64)) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    M, N, K = _dim("m", 8 * bm, shape_when), _dim("n", 8 * bn, shape_when), _dim("k", 8 * bk, shape_when)
    one_batch = _dim("batch", 1, shape_when) == 1 and shape_when.get("batch_min", 1) <= 1
    split = int(cfg.get("SPLIT_K") or 1)
    if op == "matmul":
        if one_batch:
            yield "contiguous", (_meta((M, K), dtype), _meta((K, N), dtype)), {}
            yield "A transposed", (_meta((K, M), dtype).t(), _meta((K, N), dtype)), {}
            yield "B transposed", (_meta((M, K), dtype), _meta((N, K), dtype).t()), {}
            yield "A and B transposed", (_meta((K, M), dtype).t(), _meta((N, K), dtype).t()), {}
        if _dim("batch", 6, shape_when) == 6 and shape_when.get("batch_max", 6) >= 6:
            yield "batched, broadcast batch", (_meta((2, 1, M, K), dtype), _meta((3, K, N), dtype)), {}
        if split > 1 and one_batch:  # one output tile, K long enough for every split
            m, n, k = _dim("m", bm, shape_when), _dim("n", bn, shape_when), _dim("k", 4 * bk * split, shape_when)
            yield "split-K", (_meta((m, k), dtype), _meta((k, n), dtype)), {}
        return
    act = None if cls["activation"] == "none" else cls["activation"]
    epilogue = (" + b" if cls["bias"] else "") + f", {act}"

    def args(m: int, n: int, k: int) -> tuple:
        return (_meta((m, k), dtype), _meta((n, k), dtype), _meta((n,), dtype) if cls["bias"] else None, act)

    yield f"x @ W.T{epilogue}", args(M, N, K), {}
    if split > 1:
        yield f"split-K, x @ W.T{epilogue}", args(_dim("m", bm, shape_when), _dim("n", bn, shape_when),
                                                  _dim("k", 4 * bk * split, shape_when)), {}


def _mm_cases(op_name: str, soc: str, geometry: _Geometry, notes: list[str]) -> Iterator[CompileCase]:
    import xkernels.ops as xops
    from xkernels.ops.matmul import kernels as matmul_kernels

    op = getattr(xops, op_name)
    entries, never = mm_entries(op_name, soc)
    notes += never
    for entry in entries:
        for cls in entry.classes:
            dtype = getattr(torch, cls["dtype"])
            layouts = list(_mm_layouts(op_name, entry.config, entry.shape_when, cls, dtype))
            if not layouts:
                notes.append(f"{op_name} on {soc}: {entry.where} ({cls}): no layout of the check falls in its "
                             f"shape range {entry.shape_when}; not compiled")
            for label, args, kwargs in layouts:
                with tuning.force(entry.config):
                    call = op.check(*args, **kwargs)
                    plan = op.make_plan(call, geometry)
                out = _meta(tuple(call.batch) + (call.a.shape[-2], call.b.shape[-1]), dtype)
                name = f"{_shown(plan.config)}|{label}|{entry.where}"
                if label.startswith("split-K") and plan.split_k == 1:
                    notes.append(f"{op_name} on {soc}: {entry.where} sets SPLIT_K but no one-tile call splits K "
                                 f"({label}); only its unsplit path is compiled")
                    continue
                if plan.split_k > 1:
                    ws = _meta((plan.split_k, *out.shape[-2:]), torch.float32)
                    rt = plan.args(call.a, call.b, ws, None, call.slope)
                    sig, consts = _signature(plan.jit_fn, rt, plan.constexprs)
                    yield CompileCase(op_name, plan.jit_fn, sig, consts, cls["dtype"], name + " (partials)", soc)
                    reduce = matmul_kernels.splitk_reduce_kernel
                    rt = plan.reduce_args(ws, out, call.bias, call.slope)
                    sig, consts = _signature(reduce, rt, plan.reduce_launcher.constexprs)
                    yield CompileCase(op_name, reduce, sig, consts, cls["dtype"], name + " (reduction)", soc)
                    continue
                rt = plan.args(call.a, call.b, out, call.bias, call.slope)
                sig, consts = _signature(plan.jit_fn, rt, plan.constexprs)
                yield CompileCase(op_name, plan.jit_fn, sig, consts, cls["dtype"], name, soc)


# --------------------------------------------------------------------------- all of it


def collect(socs: list[str] | None = None, ops: list[str] | None = None) -> tuple[list[CompileCase], list[str]]:
    """``(cases, notes)``: every compilation the npu tables imply on ``socs`` (default: every SoC of
    npu_socs.json) for ``ops`` (default: all), and a line for each entry not compiled and why."""
    unknown = [s for s in socs or () if s not in npu_backend.SOCS]
    if unknown:
        raise ValueError(f"unknown SoC {unknown}: backends/npu_socs.json lists {', '.join(npu_backend.SOCS)}")
    cases: list[CompileCase] = []
    notes: list[str] = []
    for soc in socs or default_socs():
        geometry = _Geometry(soc)
        for op_name in ops or OPS:
            if op_name in ("matmul", "linear"):
                cases += _mm_cases(op_name, soc, geometry, notes)
            else:
                cases += _binary_cases(op_name, soc, geometry)
    return cases, notes


def collect_cases(socs: list[str] | None = None, ops: list[str] | None = None) -> list[CompileCase]:
    """Every (op, npu tuning entry, dtype, epilogue, layout, SoC) compilation the tables imply."""
    return collect(socs, ops)[0]
