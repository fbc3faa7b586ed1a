"""What an op declares for the offline Ascend compile check (``python -m xkernels.npu_compile``).

An op whose Triton kernels run on npu implements ``Op.compile_cases(target)``: for one SoC, it
walks its npu tuning entries (``target.sections(table)``, in ``xkernels.tuning.lookup``'s order)
and yields one :class:`CompileCase` per kernel compilation a call can make: the kernel, the
signature and constexprs its launch would compile, built by the op's own planning code on
``meta`` tensors with ``target.backend``'s launch geometry. ``xkernels.cli.compile_check``
gathers every registered op's cases; nothing there names an op.

This module is part of the contract layer: it imports neither ops nor CLIs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from xkernels import tuning

#: A table section: ``(where, {"archs": [rules], "candidates": [groups]})``, e.g.
#: ``("linear.json [Ascend910B]", {...})``.
Section = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class CompileCase:
    op: str
    kernel: Callable[..., Any]  # the @triton.jit JITFunction
    signature: dict[str, str]  # every argument -> Triton type ("*fp32", "i32", ...) or "constexpr"
    constants: dict[str, object]  # values of constexpr arguments and of ints specialized to 1
    dtype: str
    config: str  # label: entry config | layout
    soc: str


@dataclass
class CompileTarget:
    """One SoC as an op's ``compile_cases`` sees it."""

    soc: str
    #: a Backend with the SoC's launch geometry (``max_programs``, ``arch``): pass it to ``make_plan``
    backend: Any
    #: table name (``"linear"``) -> its sections for this SoC, plugin and user tables first
    sections: Callable[[str], list[Section]]
    #: lines for entries not compiled and why (never selected, no layout in range)
    notes: list[str] = field(default_factory=list)

    def case(self, op: str, jit_fn: Any, args: tuple[Any, ...], constexprs: dict[str, Any], dtype: str,
             config: str) -> CompileCase:
        """The case of launching ``jit_fn`` with runtime ``args`` (tensors, ints, floats, in the
        kernel's argument order) and ``constexprs``, as Triton's launcher would specialize it."""
        sig, consts = signature(jit_fn, args, constexprs)
        return CompileCase(op, jit_fn, sig, consts, dtype, config, self.soc)


_TL = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64"}


def signature(jit_fn: Any, args: tuple[Any, ...], constexprs: dict[str, Any]) -> tuple[dict[str, str], dict]:
    """``(signature, constants)`` of a launch: pointer types from tensor dtypes, i32/i64 by an int's
    range, and every int equal to 1 also a constant (Triton specializes it at launch, which
    changes the memory plan)."""
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


def meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor with no storage, for planning a call without memory."""
    return torch.empty(shape, dtype=dtype, device="meta")


def shown(config: dict[str, Any]) -> str:
    """A config as a case label (``INDEX_64`` is said by the layout)."""
    return ",".join(f"{k}={v}" for k, v in config.items() if k != "INDEX_64")


@dataclass
class Entry:
    """A config a call can run, with the call classes that reach it (see :func:`rule_entries`)."""

    where: str  # "add_norm.json [Ascend910B] rule 2", "built-in default"
    config: dict[str, Any]
    shape_when: dict[str, Any]  # the rule's shape conditions ({} for the default)
    classes: list[dict[str, Any]] = field(default_factory=list)


def split_when(when: dict[str, Any], shape_fields: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(class conditions, shape conditions)`` of a rule's ``when``: shape conditions name a
    field of ``shape_fields``, with or without ``_min``/``_max``."""
    shape = {k: v for k, v in when.items() if k.removesuffix("_min").removesuffix("_max") in shape_fields}
    return {k: v for k, v in when.items() if k not in shape}, shape


def rule_entries(target: CompileTarget, table: str, op: str, classes: Sequence[dict[str, Any]],
                 shape_fields: Sequence[str], default: dict[str, Any],
                 keep: Callable[[dict[str, Any]], bool] = lambda when: True) -> list[Entry]:
    """The entries of ``table`` that calls of ``classes`` (dicts of table conditions) can select on
    ``target.soc``, in ``xkernels.tuning.lookup``'s order: for each class each rule whose
    non-shape conditions admit it, until a rule without shape conditions ends the walk; a class
    no such rule ends also reaches ``default`` (the op's built-in config). A rule no class
    reaches goes to ``target.notes`` (never selected) and is not returned. ``keep(when)``: the
    rules this walk is about (e.g. a forward kernel's, not its backward's)."""
    rules = [(Entry(f"{where} rule {i}", r["config"], split_when(r.get("when", {}), shape_fields)[1]),
              split_when(r.get("when", {}), shape_fields)[0])
             for where, sec in target.sections(table) for i, r in enumerate(sec["archs"]) if keep(r.get("when", {}))]
    built_in = Entry("built-in default", dict(default), {})
    for cls in classes:
        for entry, cond in rules:
            if tuning.matches(cond, cls):
                entry.classes.append(cls)
                if not entry.shape_when:
                    break
        else:
            built_in.classes.append(cls)
    target.notes.extend(f"{op} on {target.soc}: {e.where} {e.config} is never selected (earlier rules take every "
                        f"call it admits)" for e, _ in rules if not e.classes)
    return [e for e, _ in rules if e.classes] + ([built_in] if built_in.classes else [])


def dim(name: str, default: int, shape_when: dict[str, Any]) -> int:
    """``default`` moved into an entry's range for shape field ``name`` (or its exact value)."""
    if name in shape_when:
        return int(shape_when[name])
    lo, hi = shape_when.get(f"{name}_min", 1), shape_when.get(f"{name}_max", default)
    return max(int(lo), min(default, int(hi)))
