"""Portable ops: one Triton source each, run on the backend of the tensors' device.

    xkernels.ops.broadcast(x, bias)          # x + bias, bias broadcast to x.shape
    xkernels.ops.add(x, y, alpha=1)          # torch.add semantics
    xkernels.ops.matmul(a, b)                # torch.matmul semantics
    xkernels.ops.linear(x, w, b, activation="gelu")   # F.linear + activation, fused epilogue
    xkernels.ops.gated_linear(x, wg, wu)     # silu(x @ wg.T) * (x @ wu.T): a gated MLP's gate/up
    xkernels.ops.add_layer_norm(x, residual, w, b)    # (F.layer_norm(x + residual), x + residual), one pass
    xkernels.ops.add_rms_norm(x, residual, w)         # (RMSNorm(x + residual), x + residual), one pass
    xkernels.ops.rotary_embedding(q, k, cos, sin)   # transformers' apply_rotary_pos_emb, q and k in one launch
    xkernels.ops.explain(xkernels.ops.add, x, y)      # which backend/kernel/config, and why
"""

from __future__ import annotations

from typing import Any

from xkernels.ops import library
from xkernels.ops.elementwise.add import add
from xkernels.ops.elementwise.broadcast import broadcast
from xkernels.ops.fused import add_norm_grad
from xkernels.ops.fused import gated_linear as _gated_linear
from xkernels.ops.fused.add_norm import add_layer_norm, add_rms_norm
from xkernels.ops.fused.rotary import rotary_embedding
from xkernels.ops.matmul import linear, matmul
from xkernels.ops.op import Explanation, Op
from xkernels.ops.route import AtenRoute, KernelRoute, Route, RouteError, VendorRoute

library.register({"broadcast": broadcast, "add": add, "matmul": matmul, "linear": linear})
# the fused ops define their own fragments of the xkernels namespace
add_norm_grad.register({"add_layer_norm": add_layer_norm, "add_rms_norm": add_rms_norm})
_gated_linear.register()
gated_linear = _gated_linear.gated_linear

__all__ = ["AtenRoute", "Explanation", "KernelRoute", "Op", "Route", "RouteError", "VendorRoute", "add", "add_layer_norm",
           "add_rms_norm", "broadcast", "explain", "gated_linear", "linear", "matmul",
           "rotary_embedding"]


def explain(op: Op, *args: Any, **kwargs: Any) -> Explanation:
    """Explain what ``op(*args, **kwargs)`` would run; same as ``op.explain(...)``."""
    return op.explain(*args, **kwargs)
