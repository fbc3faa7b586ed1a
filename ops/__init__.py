"""Portable ops: one Triton source each, run on the backend of the tensors' device.

    xkernels.ops.broadcast(x, bias)          # x + bias, bias broadcast to x.shape
    xkernels.ops.add(x, y, alpha=1)          # torch.add semantics
    xkernels.ops.matmul(a, b)                # torch.matmul semantics
    xkernels.ops.linear(x, w, b, activation="gelu")   # F.linear + activation, fused epilogue
    xkernels.ops.explain(xkernels.ops.add, x, y)      # which backend/kernel/config, and why
"""

from __future__ import annotations

from typing import Any

from xkernels.ops import library
from xkernels.ops.elementwise.add import add
from xkernels.ops.elementwise.broadcast import broadcast
from xkernels.ops.matmul import linear, matmul
from xkernels.ops.op import Explanation, Op
from xkernels.ops.route import AtenRoute, KernelRoute, Route, RouteError, VendorRoute

library.register({"broadcast": broadcast, "add": add, "matmul": matmul, "linear": linear})

__all__ = ["AtenRoute", "Explanation", "KernelRoute", "Op", "Route", "RouteError", "VendorRoute", "add", "broadcast",
           "explain", "linear", "matmul"]


def explain(op: Op, *args: Any, **kwargs: Any) -> Explanation:
    """Explain what ``op(*args, **kwargs)`` would run; same as ``op.explain(...)``."""
    return op.explain(*args, **kwargs)
