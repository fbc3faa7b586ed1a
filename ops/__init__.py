"""Portable ops: one Triton source each, run on the backend of the tensors' device.

    xkernels.ops.broadcast(x, bias)          # x + bias, bias broadcast to x.shape
    xkernels.ops.add(x, y, alpha=1)          # torch.add semantics
    xkernels.ops.matmul(a, b)                # torch.matmul semantics
    xkernels.ops.linear(x, w, b, activation="gelu")   # F.linear + activation, fused epilogue
    xkernels.ops.gated_linear(x, wg, wu)     # silu(x @ wg.T) * (x @ wu.T): a gated MLP's gate/up
    xkernels.ops.explain(xkernels.ops.add, x, y)      # which backend/kernel/config, and why
"""

from __future__ import annotations

from typing import Any

from xkernels.ops import library
from xkernels.ops.elementwise.add import add
from xkernels.ops.elementwise.broadcast import broadcast
from xkernels.ops.fused import gated_linear as _gated_linear
from xkernels.ops.matmul import linear, matmul
from xkernels.ops.op import Explanation, Op

library.register({"broadcast": broadcast, "add": add, "matmul": matmul, "linear": linear})
_gated_linear.register()  # its own fragment of the xkernels namespace
gated_linear = _gated_linear.gated_linear

__all__ = ["Explanation", "Op", "add", "broadcast", "explain", "gated_linear", "linear", "matmul"]


def explain(op: Op, *args: Any, **kwargs: Any) -> Explanation:
    """Explain what ``op(*args, **kwargs)`` would run; same as ``op.explain(...)``."""
    return op.explain(*args, **kwargs)
