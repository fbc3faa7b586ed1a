"""``broadcast(x, bias, *, out=None)``: ``x + bias`` with ``bias`` broadcast to ``x.shape``."""

from __future__ import annotations

from typing import Any

import torch

from xkernels.ops import checks
from xkernels.ops.autograd import BinaryFunction, reject_out
from xkernels.ops.elementwise.binary import BinaryCall, BinaryOp
from xkernels.ops.op import Param
from xkernels.ops.route import Route


class Broadcast(BinaryOp):
    """x + bias where bias broadcasts to x's shape and the result never grows beyond it.

    Typical biases: length ``x.shape[-1]`` (the fast path: one row loaded per tile), per-channel
    ``(C, 1, 1)`` over NCHW, attention masks ``[B, 1, 1, S]`` over ``[B, H, S, S]``, ``(1, D)``,
    a single element. The result dtype follows PyTorch's promotion of ``x + bias``.
    """

    name = "broadcast"
    params = (Param("x"), Param("bias"), Param("out", None, positional=False))

    def check(self, x: Any, bias: Any, *, out: torch.Tensor | None = None) -> BinaryCall:
        checks.require_tensor("broadcast", "x", x)
        checks.require_tensor("broadcast", "bias", bias)
        device = checks.common_device("broadcast", {"x": x, "bias": bias})
        shape = checks.broadcast_shape("broadcast", {"x": x.shape, "bias": bias.shape})
        if shape != x.shape:
            raise ValueError(f"xkernels.ops.broadcast: 'bias' of shape {tuple(bias.shape)} would grow 'x' of "
                             f"shape {tuple(x.shape)} to {tuple(shape)}; bias must broadcast to x's shape")
        return self._call(x, bias, 1, out, shape, device)

    def autograd(self, canon: tuple[Any, ...], route: Route | None = None) -> torch.Tensor:
        x, bias, out = canon
        reject_out(self.name, out)
        return BinaryFunction.apply(self.forward_of(route, canon, (0, 1), self.call_no_grad), x, bias, 1)

    def library_call(self, canon: tuple[Any, ...]) -> torch.Tensor:
        return torch.ops.xkernels.broadcast.default(canon[0], canon[1])



broadcast = Broadcast()
