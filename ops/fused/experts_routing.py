"""A mixture-of-experts layer's routing passes around its grouped GEMMs, in one Triton pass each way.

transformers' ``grouped_mm`` experts (``grouped_mm_experts_forward``, 5.23) sort the T x K routed
(token, expert) slots by expert (``perm``), gather the tokens' rows in that order, run the
grouped GEMMs, then weigh and put back: ``(proj * w[perm][:, None])[inv_perm].view(T, K,
H).sum(1)``. That is three passes over the S = T K rows (the product, the gather, the sum) and
in training as many more backward, with a scatter into zeros for each gather.

* :func:`combine_routed`: the weighted sum in one pass, each row of ``proj`` read in place through
  ``inv_perm`` (``combine_kernel``), as PyTorch computes it (the product rounded to its promoted
  dtype, the sum in fp32). Backward: one ``combine_grad_kernel`` pass writes d(proj) (its rows in
  place) and d(w) (a dot product per slot).
* :func:`gather_routed`: the tokens' rows in expert order (PyTorch's gather forward); its backward
  is the combine without weights (each token's K rows summed, in fp32), where PyTorch's is a sort
  and a scatter-add into zeros.

Both return ``None`` where the pass does not apply, and the caller runs PyTorch's ops: a backend
that runs no kernels (the cpu backend), while ``torch.compile`` traces, dtypes other than fp16 /
bf16 / fp32, anything but a 2-D ``(rows, H)`` operand with contiguous rows. A backward that builds
a graph (``create_graph``) differentiates PyTorch's composition.
"""

from __future__ import annotations

from typing import Any

import torch

from xkernels import dispatch
from xkernels.launch import Launcher
from xkernels.ops.fused import gated_linear_plan
from xkernels.ops.layout import INT32_MAX, next_pow2
from xkernels.ops.matmul.pre_activation import Remembered

__all__ = ["combine_routed", "gather_routed"]

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: ``ROUND`` of the product's dtype (the promoted dtype of ``proj * w``)
_ROUND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: the combine's tile: tokens (or slots) x columns; the gradient walks H in BLOCK_H steps
COMBINE_BLOCK = (16, 256)
_plans = Remembered(64)


class CombinePlan:
    """One launch of ``combine_kernel`` (``grad=False``) or ``combine_grad_kernel``: tiles, grid,
    constexprs for (T tokens or S slots, H, K) on one backend and device."""

    def __init__(self, backend: Any, device: torch.device, rows: int, H: int, K: int, weighted: bool, ordered: bool,
                 round_to: int, grad: bool, need_dw: bool, span: int) -> None:
        from xkernels.ops.fused import experts_routing_kernels as RK

        bt, bh = min(COMBINE_BLOCK[0], next_pow2(rows)), min(COMBINE_BLOCK[1], next_pow2(H))
        tiles = (rows + bt - 1) // bt * (1 if grad else (H + bh - 1) // bh)
        programs = backend.programs(tiles, "vector", device)
        self.constexprs = dict(K=K, BLOCK_T=bt, BLOCK_H=bh, ORDERED=ordered, ROUND=round_to, PERSISTENT=programs < tiles,
                               INDEX_64=span + 2**16 > INT32_MAX)
        if grad:
            self.constexprs["NEED_DW"] = need_dw
        else:
            self.constexprs["WEIGHTED"] = weighted
        self.jit_fn = RK.combine_grad_kernel if grad else RK.combine_kernel
        options = {"num_warps": 4} if "num_warps" in backend.launch_options else {}
        self.launcher = Launcher(backend.kernel(self.jit_fn), (programs,), self.constexprs, options,
                                 backend.fast_launch, varying=(*range(6), 10, 11, 12) if grad else (0, 1, 2, 3, 8, 9))
        self.tail = (rows, H, tiles, programs)


def _plan(backend: Any, device: torch.device, rows: int, H: int, K: int, weighted: bool, ordered: bool,
          round_to: int, grad: bool, need_dw: bool, span: int, dtypes: tuple[torch.dtype, ...]) -> CombinePlan:
    """The plan of one launch, remembered per signature (``dtypes``: its tensors', which the
    compiled kernel is specialized on)."""
    key = (backend.name, device, rows, H, K, weighted, ordered, round_to, grad, need_dw, span > INT32_MAX - 2**16,
           dtypes)
    return _plans.get(key, lambda: CombinePlan(backend, device, rows, H, K, weighted, ordered, round_to, grad,
                                               need_dw, span))


def _combine(backend: Any, proj: torch.Tensor, weights: torch.Tensor | None, order: torch.Tensor | None, K: int,
             prod: torch.dtype, out_dtype: torch.dtype) -> torch.Tensor:
    S, H = proj.shape
    T = S // K
    y = gated_linear_plan._empty((T, H), out_dtype, proj.device)
    if T and H:
        span = max(S * proj.stride(0), T * H)
        args = (proj, proj if weights is None else weights, proj if order is None else order, y)
        plan = _plan(backend, proj.device, T, H, K, weights is not None, order is not None, _ROUND[prod], False,
                     False, span, tuple(a.dtype for a in args))
        plan.launcher(*args, *plan.tail, proj.stride(0), y.stride(0))
    return y


def _composed(proj: torch.Tensor, weights: torch.Tensor, order: torch.Tensor | None, K: int,
              out_dtype: torch.dtype) -> torch.Tensor:
    """PyTorch's composition (transformers' own code, ``weights`` in slot order)."""
    w = weights if order is None else weights[torch.argsort(order)]  # in row order, as transformers weighs
    weighted = proj * w.unsqueeze(-1)
    if order is not None:
        weighted = weighted[order]
    return weighted.view(-1, K, proj.shape[-1]).sum(dim=1).to(out_dtype)


class CombineFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, proj: torch.Tensor, weights: torch.Tensor, order: torch.Tensor | None, K: int,
                prod: torch.dtype, out_dtype: torch.dtype, backend: Any) -> torch.Tensor:
        ctx.save_for_backward(proj, weights, order)
        ctx.K, ctx.prod, ctx.out_dtype, ctx.backend = K, prod, out_dtype, backend
        return _combine(backend, proj, weights, order, K, prod, out_dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        proj, weights, order = ctx.saved_tensors
        if not torch.is_grad_enabled() and dy.dim() == 2 and dy.dtype in _DTYPES:
            dy = dy if dy.stride(-1) == 1 else dy.contiguous()  # a sum's gradient is expanded: stride 0
            S, H = proj.shape
            dp = gated_linear_plan._empty((S, H), proj.dtype, proj.device)
            need_dw = ctx.needs_input_grad[1]
            dw = gated_linear_plan._empty((S,), weights.dtype, weights.device) if need_dw else None
            if S and H:
                span = max(S * max(proj.stride(0), H), (S // ctx.K) * dy.stride(0))
                args = (dy, proj, weights, proj if order is None else order, dp, proj if dw is None else dw)
                plan = _plan(ctx.backend, proj.device, S, H, ctx.K, True, order is not None, _ROUND[ctx.prod], True,
                             need_dw, span, tuple(a.dtype for a in args))
                plan.launcher(*args, *plan.tail, dy.stride(0), proj.stride(0), dp.stride(0))
            elif need_dw:
                dw.zero_()
            return dp, dw, None, None, None, None, None
        build = torch.is_grad_enabled()
        with torch.enable_grad():
            leaves = [v if build else v.detach().requires_grad_(v.requires_grad or need)
                      for v, need in ((proj, ctx.needs_input_grad[0]), (weights, ctx.needs_input_grad[1]))]
            y = _composed(leaves[0], leaves[1], order, ctx.K, ctx.out_dtype)
            wanted = [v for v in leaves if v.requires_grad]
            grads = iter(torch.autograd.grad(y, wanted, dy, create_graph=build))
        dp, dw = (next(grads) if v.requires_grad else None for v in leaves)
        return dp, dw, None, None, None, None, None


class GatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rows: torch.Tensor, order: torch.Tensor, K: int, backend: Any) -> torch.Tensor:
        ctx.save_for_backward(rows, order)
        ctx.K, ctx.backend, ctx.T = K, backend, x.shape[0]
        return x[rows]

    @staticmethod
    def backward(ctx: Any, dg: torch.Tensor) -> tuple[Any, ...]:
        rows, order = ctx.saved_tensors
        if not torch.is_grad_enabled() and dg.dim() == 2 and dg.dtype in _DTYPES:
            dg = dg if dg.stride(-1) == 1 else dg.contiguous()
            return _combine(ctx.backend, dg, None, order, ctx.K, dg.dtype, dg.dtype), None, None, None, None
        dx = torch.zeros((ctx.T, dg.shape[-1]), dtype=dg.dtype, device=dg.device)
        return dx.index_add(0, rows, dg), None, None, None, None


def _backend(*tensors: Any) -> Any:
    if _is_compiling() or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    backend = dispatch.select(tensors[0].device)
    return backend if backend.runs_triton and all(t.device == tensors[0].device for t in tensors) else None


def _rows_ok(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.dtype in _DTYPES and (t.stride(-1) == 1 or t.shape[-1] <= 1)


def combine_routed(proj: torch.Tensor, weights: torch.Tensor, order: torch.Tensor | None, top_k: int,
                   out_dtype: torch.dtype) -> torch.Tensor | None:
    """``(T, H)``: ``y[t] = sum over k of proj[order[t K + k]] * weights[t K + k]`` (``order``
    ``None``: row ``t K + k``), in ``out_dtype``: transformers' ``(proj * weights[perm][:, None])
    [inv_perm].view(T, K, H).sum(1).to(out_dtype)`` with ``order = inv_perm`` and ``weights`` in
    slot order (``top_k_weights.reshape(-1)``). With autograd; ``None`` where the pass does not
    apply (module doc)."""
    backend = _backend(proj, weights, *(() if order is None else (order,)))
    if (backend is None or not _rows_ok(proj) or weights.dtype not in _DTYPES or out_dtype not in _DTYPES
            or not isinstance(top_k, int) or top_k < 1 or proj.shape[0] % top_k
            or weights.shape != (proj.shape[0],)
            or order is not None and (order.shape != weights.shape or order.dtype not in (torch.int32, torch.int64)
                                      or order.stride(0) != 1 and order.numel() > 1)):
        return None
    weights = weights.contiguous()
    prod = torch.promote_types(proj.dtype, weights.dtype)
    if torch.is_grad_enabled() and (proj.requires_grad or weights.requires_grad):
        return CombineFunction.apply(proj, weights, order, top_k, prod, out_dtype, backend)
    return _combine(backend, proj, weights, order, top_k, prod, out_dtype)


def gather_routed(x: torch.Tensor, rows: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor | None:
    """``x[rows]`` (the T tokens' rows in expert order, ``rows = perm // K``) whose backward sums
    each token's K gradient rows through ``order`` (``inv_perm``) in one pass. ``None`` where the
    pass does not apply (module doc), or where no gradient is wanted (PyTorch's gather is the same)."""
    if not (torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad):
        return None
    backend = _backend(x, rows, order)
    if (backend is None or not _rows_ok(x) or rows.dim() != 1 or rows.shape != order.shape
            or rows.numel() != x.shape[0] * top_k or order.dtype not in (torch.int32, torch.int64)
            or order.stride(0) != 1 and order.numel() > 1):
        return None
    return GatherFunction.apply(x, rows, order, top_k, backend)
