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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

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
