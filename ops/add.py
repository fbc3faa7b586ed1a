"""``add(x, y, *, alpha=1, out=None)``: ``torch.add`` semantics on any registered device."""

from __future__ import annotations

from typing import Any

import torch

from xkernels.ops import checks
from xkernels.ops.binary import BinaryCall, BinaryOp


class Add(BinaryOp):
    """x + alpha * y with broadcasting on both sides and PyTorch type promotion.

    Either side may be a Python number or a 0-d tensor (not both numbers). float16, bfloat16,
    float32, int32 and int64 run the Triton kernel (compute in float32 for the half types, as
    PyTorch does); other dtypes (float64, complex, bool, int8, ...) are computed by PyTorch.
    """

    name = "add"

    def check(self, x: Any, y: Any, *, alpha: Any = 1, out: torch.Tensor | None = None) -> BinaryCall:
        xt, yt = isinstance(x, torch.Tensor), isinstance(y, torch.Tensor)
        for arg, v, is_t in (("x", x, xt), ("y", y, yt)):
            if not is_t and not checks.is_number(v):
                raise TypeError(f"xkernels.ops.add: argument '{arg}' must be a tensor or a Python number, "
                                f"got {checks.describe(v)}")
        if not xt and not yt:
            raise TypeError(f"xkernels.ops.add: at least one of 'x' and 'y' must be a tensor, got "
                            f"{checks.describe(x)} and {checks.describe(y)}")
        tensors = {n: v for n, v in (("x", x), ("y", y)) if isinstance(v, torch.Tensor)}
        device = checks.common_device("add", tensors)
        shape = checks.broadcast_shape("add", {n: t.shape for n, t in tensors.items()})
        return self._call(x, y, alpha, out, shape, device)


add = Add()
