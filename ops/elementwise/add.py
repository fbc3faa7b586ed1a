"""``add(x, y, *, alpha=1, out=None)``: ``torch.add`` semantics on any registered device."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from xkernels.ops import checks, library
from xkernels.ops.autograd import BinaryFunction, reject_out
from xkernels.ops.elementwise.binary import BinaryCall, BinaryOp
from xkernels.ops.op import Param
from xkernels.ops.route import Route

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # PyTorch's integer scalars are int64


class Add(BinaryOp):
    """x + alpha * y with broadcasting on both sides and PyTorch type promotion.

    Either side may be a Python number or a 0-d tensor. float16, bfloat16, float32, int32 and
    int64 run the Triton kernel (compute in float32 for the half types, as PyTorch does); other
    dtypes (float64, complex, bool, int8, ...) are computed by PyTorch. Two Python numbers give
    what ``torch.add`` gives: a 0-d tensor (default float dtype for floats, int64 for ints, bool
    for bools, complex for complex) on the CPU, or ``out=``, computed by PyTorch on any backend.
    """

    name = "add"
    params = (Param("x"), Param("y"), Param("out", None, positional=False),
              Param("alpha", 1, positional=False, key="alpha"))

    def compile_layouts(self, cfg: dict[str, Any], variant: str, dtype: torch.dtype) -> Any:
        """broadcast's layouts, then a Python-number operand with alpha and int64 indexing (flat)
        or both sides broadcast (tiled)."""
        from xkernels.ops.elementwise.compile import add_layouts

        return add_layouts(cfg, variant, dtype)

    def check(self, x: Any, y: Any, *, alpha: Any = 1, out: torch.Tensor | None = None) -> BinaryCall:
        xt, yt = isinstance(x, torch.Tensor), isinstance(y, torch.Tensor)
        for arg, v, is_t in (("x", x, xt), ("y", y, yt)):
            if not is_t and not checks.is_number(v):
                raise TypeError(f"xkernels.ops.add: argument '{arg}' must be a tensor or a Python number, "
                                f"got {checks.describe(v)}")
        if not xt and not yt:
            return self._numbers_call(x, y, alpha, out)
        tensors = {n: v for n, v in (("x", x), ("y", y)) if isinstance(v, torch.Tensor)}
        device = checks.common_device("add", tensors)
        shape = checks.broadcast_shape("add", {n: t.shape for n, t in tensors.items()})
        return self._call(x, y, alpha, out, shape, device)

    def _numbers_call(self, x: Any, y: Any, alpha: Any, out: Any) -> BinaryCall:
        """Two Python numbers: ``torch.add``'s result, a 0-d tensor on the CPU (or ``out=``'s device,
        as PyTorch treats numbers as CPU scalars that join any device)."""
        for arg, v in (("x", x), ("y", y)):
            if isinstance(v, numbers.Integral) and not INT64_MIN <= v <= INT64_MAX:
                raise ValueError(f"xkernels.ops.add: '{arg}' {v} is outside int64, the range of PyTorch's "
                                 f"integer scalars")
        device = out.device if isinstance(out, torch.Tensor) else torch.device("cpu")
        call = self._call(x, y, alpha, out, torch.Size(), device)
        call.kernel_ok, call.no_tensor = False, True
        call.fallback_reason = "no tensor operand: PyTorch computes the 0-d result, as torch.add does"
        return call

    def without_backend(self, call: BinaryCall) -> bool:
        return call.no_tensor

    def autograd(self, canon: tuple[Any, ...], route: Route | None = None) -> torch.Tensor:
        x, y, out, alpha = canon
        reject_out(self.name, out)
        run = self.forward_of(route, canon, (0, 1), lambda x, y: self.call_no_grad(x, y, alpha=alpha))
        return BinaryFunction.apply(run, x, y, alpha)

    def library_call(self, canon: tuple[Any, ...]) -> torch.Tensor:
        x, y, _, alpha = canon
        return library.add(x, y, alpha)



add = Add()
