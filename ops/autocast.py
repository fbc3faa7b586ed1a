"""Autocast for the matmul-like ops: under ``torch.autocast``, ``linear``, ``matmul`` and
``gated_linear`` compute in the autocast dtype, as PyTorch's ``F.linear`` / ``torch.matmul`` do.

PyTorch casts the operands of its lower-precision ops (``linear``, ``matmul``, ``mm``, ...) to the
autocast dtype of their device type before they run; a custom op gets no such cast. Without one a
patched model trained under ``torch.autocast(dtype=torch.bfloat16)`` would run its layers in fp32
(another result dtype, and fp32 GEMMs). So an op that declares ``Op.autocast_params`` has those
arguments cast here, where autocast is on for their device type: floating tensors other than
float64 (which autocast leaves alone, as PyTorch does) not already in the autocast dtype, by
``Tensor.to`` (recorded by autograd: the gradient reaches the fp32 parameter). Other arguments
(a residual, ``out=``) are not cast: ``linear(..., residual=r)`` adds ``r`` to the cast GEMM's
result with PyTorch's type promotion, as ``F.linear(...) + r`` does under autocast.

Ops without ``autocast_params`` (the element-wise and add + norm ops) run on their inputs' dtypes
under autocast, as any custom op does. ``xkernels.patch``'s blocks take the fused add + norm
under autocast only where the norm's own forward would compute in fp32 anyway (an fp32 sum and
fp32 parameters: ``xkernels.block_steps.same_math``); their gated MLPs cast here in training.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

#: whether autocast is on for any device type (one C call, ~0.1 us)
autocasting = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu"))


def dtype_for(t: Any) -> torch.dtype | None:
    """The autocast dtype for tensor ``t``'s device type, or ``None`` where autocast is off there."""
    if not isinstance(t, torch.Tensor):
        return None
    kind = t.device.type
    try:
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    except RuntimeError:  # a device type autocast does not know (meta)
        return None


def cast(t: Any, dtype: torch.dtype) -> Any:
    """``t`` in ``dtype`` where autocast would cast it: a floating tensor, not float64."""
    if isinstance(t, torch.Tensor) and t.dtype != dtype and t.is_floating_point() and t.dtype != torch.float64:
        return t.to(dtype)
    return t


def cast_all(values: Iterable[Any]) -> tuple[Any, ...]:
    """``values`` cast (``cast``) to the autocast dtype of the first tensor's device type, or as
    they are where autocast is off there."""
    values = tuple(values)
    first = next((v for v in values if isinstance(v, torch.Tensor)), None)
    dtype = dtype_for(first)
    return values if dtype is None else tuple(cast(v, dtype) for v in values)


def cast_args(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's ``args``/``kwargs`` with ``op.autocast_params`` cast (the module doc)."""
    names = op.autocast_params
    first = next((v for i, v in enumerate(args) if i < len(op.params) and op.params[i].name in names
                  and isinstance(v, torch.Tensor)), None)
    if first is None:
        first = next((v for k, v in kwargs.items() if k in names and isinstance(v, torch.Tensor)), None)
    dtype = dtype_for(first)
    if dtype is None:
        return args, kwargs
    params = op.params
    args = tuple(cast(v, dtype) if i < len(params) and params[i].name in names else v for i, v in enumerate(args))
    if kwargs:
        kwargs = {k: cast(v, dtype) if k in names else v for k, v in kwargs.items()}
    return args, kwargs
