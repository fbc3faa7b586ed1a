"""Argument checks shared by the ops. Every failure is a ValueError/TypeError that names the
argument and the shapes, dtypes or devices involved, raised before any kernel runs."""

from __future__ import annotations

import numbers
from typing import Any

import torch

#: dtypes the element-wise Triton kernels handle; others go to the documented PyTorch fallback.
ELEMENTWISE_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64)
#: dtypes the matmul Triton kernel handles.
MATMUL_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def describe(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"Tensor(shape={tuple(v.shape)}, dtype={v.dtype}, device={v.device})"
    return f"{type(v).__name__} {v!r}"


def require_tensor(op: str, arg: str, v: Any) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"xkernels.ops.{op}: argument '{arg}' must be a torch.Tensor, got {describe(v)}")
    return v


def is_number(v: Any) -> bool:
    return isinstance(v, numbers.Number) and not isinstance(v, torch.Tensor)


def check_alpha(op: str, alpha: Any, dtype: torch.dtype) -> None:
    """PyTorch's rules for ``alpha`` of a result of ``dtype``: a bool only for bool results, a
    non-integer only for floating/complex results, a complex only for complex results."""
    name = f"xkernels.ops.{op}: 'alpha'"
    if not is_number(alpha):
        raise TypeError(f"{name} must be a number, got {describe(alpha)}")
    if isinstance(alpha, bool) and dtype != torch.bool:
        raise TypeError(f"{name} {alpha!r} is a bool but the result dtype is {dtype}; PyTorch allows a bool "
                        f"alpha only for bool results")
    if isinstance(alpha, numbers.Complex) and not isinstance(alpha, numbers.Real) and not dtype.is_complex:
        raise TypeError(f"{name} must be a real number for result dtype {dtype}, got {describe(alpha)}")
    if not (dtype.is_floating_point or dtype.is_complex) and not isinstance(alpha, numbers.Integral):
        raise TypeError(f"{name} {alpha!r} is not an integer but the result dtype is {dtype}")


def common_device(op: str, named: dict[str, torch.Tensor]) -> torch.device:
    """The one device of the tensors; 0-d CPU tensors may join any device (as in PyTorch)."""
    it = iter(named.values())
    dev = next(it).device
    if all(t.device == dev for t in it):
        return dev
    devices = {n: t.device for n, t in named.items()}
    main = [d for n, d in devices.items() if not (named[n].dim() == 0 and d.type == "cpu")]
    if len(set(main)) > 1:
        listing = ", ".join(f"'{n}' on {d}" for n, d in devices.items())
        raise ValueError(f"xkernels.ops.{op}: tensors must be on one device, got {listing}")
    return main[0] if main else next(iter(devices.values()))


def broadcast_shape(op: str, named: dict[str, torch.Size]) -> torch.Size:
    """PyTorch's broadcasting of the named shapes (pure Python: this is on every call's path)."""
    shapes = list(named.values())
    first = shapes[0]
    if all(s == first for s in shapes):
        return torch.Size(first)
    ndim = max(len(s) for s in shapes)
    result = [1] * ndim
    for s in shapes:
        off = ndim - len(s)
        for i, d in enumerate(s):
            r = result[off + i]
            if d != r and d != 1:
                if r != 1:
                    listing = ", ".join(f"'{n}' {tuple(v)}" for n, v in named.items())
                    raise ValueError(f"xkernels.ops.{op}: shapes do not broadcast: {listing}")
                result[off + i] = d
    return torch.Size(result)


def check_out(op: str, out: Any, shape: torch.Size, dtype: torch.dtype, device: torch.device,
              inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Validate ``out=``: a tensor of exactly the result's shape, dtype and device, with no
    internal overlap, and either identical to an input view (in place) or disjoint from it."""
    if out is None:
        return None
    require_tensor(op, "out", out)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"xkernels.ops.{op}: 'out' has shape {tuple(out.shape)}, the result has shape {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"xkernels.ops.{op}: 'out' has dtype {out.dtype}, the result has dtype {dtype}")
    if out.device != device:
        raise ValueError(f"xkernels.ops.{op}: 'out' is on {out.device}, the inputs are on {device}")
    if out.numel() > 1 and any(st == 0 and sz > 1 for sz, st in zip(out.shape, out.stride())):
        raise ValueError(f"xkernels.ops.{op}: 'out' has internal overlap (a stride-0 dimension): "
                         f"shape {tuple(out.shape)}, strides {out.stride()}")
    for name, t in inputs.items():
        if _overlaps(out, t) and not (out.data_ptr() == t.data_ptr() and out.shape == t.shape
                                      and out.stride() == t.stride()):
            raise ValueError(f"xkernels.ops.{op}: 'out' partially overlaps input '{name}' "
                             f"(shares memory without being the same view); pass a separate tensor")
    return out


def _span(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (0, 0)
    start = t.data_ptr()
    extent = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1
