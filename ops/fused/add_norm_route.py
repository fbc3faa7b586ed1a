"""Routes of repeated ``add_layer_norm`` / ``add_rms_norm`` calls (``AddNormOp.make_hot``).

A signature (each tensor's shape, strides, dtype and device, ``None`` for an absent one, the type
of ``eps`` and ``offset``, the value of ``return_sum``: ``ops/signature.py``) fixes everything the
checks and the plan decide, so a repeat allocates its results and launches the forward kernel
with the call's tensors, without ``check`` or the plan lookup. Two launch sides per route, each
made on first use from the op's own cached plans:

* ``run`` (no gradient required): the plan that writes ``s`` only when ``return_sum``;
* ``autograd_run`` (a tensor requires grad; ``AddNormOp._recorded``): the plan that always writes
  ``s`` and the fp32 statistics, inside the op's ``autograd.Function`` (``add_norm_grad``), so the
  fused backward follows as it does for the full path; the route's ``add_norm_bwd.HotBackward``
  launches the repeats of that backward without its per-call plan lookup. Where the native
  extension is loaded, the repeats are recorded and differentiated in C++ instead
  (``add_norm_native``): same launches, no Python autograd.

``eps`` and ``offset`` are not in the key: they are passed with each call and the launch records
(which pack every scalar) are kept per ``(eps, offset)`` value, at most ``LIMIT`` at a time. A zero
offset is passed as -0.0 on every route (``w + -0.0`` is ``w`` bit for bit, as torch's
``y * w`` is), so 0.0 and -0.0 need no separate records; the sign of a zero ``eps`` cannot change
``var + eps`` (the variance is never -0.0). A non-zero ``offset`` without a weight (a
``ValueError`` of the checks) and a launch that declines (a misaligned pointer, a launch hook)
return ``None``: the front door then takes the full path, which raises or launches the ordinary way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from xkernels.ops.fused import add_norm_bwd, add_norm_native, add_norm_plan
from xkernels.ops.fused import add_norm_grad as grad
from xkernels.ops.fused.add_norm_plan import AddNormCall, AddNormPlan
from xkernels.ops.layout import contiguous_strides
from xkernels.ops.route import KernelRoute

LIMIT = 16  # launch records kept per side, by (eps, offset) value


class _Side:
    """One plan's launches: allocate, then launch by the record of the call's (eps, offset)."""

    __slots__ = ("launcher", "tail", "store_sum", "stats", "fns")

    def __init__(self, plan: AddNormPlan) -> None:
        self.launcher = plan.launcher
        self.tail = (plan.n_tiles, plan.grid[0])
        self.store_sum, self.stats = plan.store_sum, plan.store_stats
        self.fns: dict[tuple[Any, Any], Any] = {}

    def launch(self, tensors: tuple[torch.Tensor, ...], fixed: tuple[Any, ...], eps: Any, offset: Any) -> bool:
        fn = self.fns.get((eps, offset))
        if fn is not None:
            return fn(*tensors)
        # first launch of this value: the ordinary way (compiles where needed), then its record
        args = (*tensors, *fixed, float(eps), float(offset) or -0.0, *self.tail)
        self.launcher(*args)
        if len(self.fns) >= LIMIT:
            self.fns.clear()
        self.fns[(eps, offset)] = self.launcher.hot(args, len(tensors))
        return True


def make_route(op: Any, plan: AddNormPlan, call: AddNormCall) -> KernelRoute | None:
    """The route of ``call``'s signature, or ``None`` (repeats keep the full path) where an
    operand is copied to contiguous rows or the result is empty."""
    if plan.copies or call.x.numel() == 0:
        return None
    backend, kind, layer = plan.backend, call.kind, call.kind == "layer"
    grad_plan = op.plan(dataclasses.replace(call, store_sum=True, store_stats=True), backend)
    plain_plan = op.plan(dataclasses.replace(call, store_sum=call.return_sum, store_stats=False), backend)
    assert isinstance(grad_plan, AddNormPlan) and isinstance(plain_plan, AddNormPlan)
    plain, graded = _Side(plain_plan), _Side(grad_plan)
    fixed = plan.tail  # R, N and the row strides: the same for both plans
    size, dtype, dev = tuple(call.shape), call.dtype, call.device
    stride, rows = contiguous_strides(size), call.rows
    alloc = add_norm_plan.allocator(backend, dev)
    f32 = torch.float32
    res = None if call.residual is None else (call.residual.shape, call.residual.dtype)
    b_dtype = None if call.bias is None else call.bias.dtype
    hot = add_norm_bwd.HotBackward(backend, kind, call.x.shape, dtype, call.x.dtype, res, b_dtype, dev)
    meta = (call.x.shape, call.x.dtype, res, b_dtype, backend)
    has_w = call.weight is not None

    def forward(side: _Side, x: Any, r: Any, w: Any, b: Any, eps: Any, offset: Any) -> Any:
        y = alloc(size, stride, dtype)
        s = alloc(size, stride, dtype) if side.store_sum else y
        mean = alloc((rows,), (1,), f32) if side.stats and layer else y
        rstd = alloc((rows,), (1,), f32) if side.stats else y
        tensors = (x, x if r is None else r, y if w is None else w, y if b is None else b, s, y, mean, rstd)
        if not side.launch(tensors, fixed, eps, offset):
            return None
        return y, s, mean, rstd

    def run(x: Any, r: Any, w: Any, b: Any, eps: Any, offset: Any, return_sum: bool) -> Any:
        if offset and not has_w:
            return None  # the checks' ValueError: the full path raises it
        out = forward(plain, x, r, w, b, eps, offset)
        if out is None:
            return None
        return (out[0], out[1]) if return_sum else out[0]

    natives = add_norm_native.NativeSide(graded, backend, size, dtype, layer, (*meta, hot))

    def recorded(x: Any, r: Any, w: Any, b: Any, eps: Any, offset: Any, return_sum: bool) -> Any:
        if offset and not has_w:
            return None
        spec = natives.spec(eps, offset)
        if spec is not None:
            out = spec.apply(x, r, w, b)
            if out is not None:
                return out if return_sum else out[0]

        def fwd() -> Any:
            out = forward(graded, x, r, w, b, eps, offset)
            if out is None:  # the launch declined: the full forward, checks and all
                full = op._check(x, r, w, b, eps, offset, return_sum)
                full.store_sum = True
                return op.forward_all(full)
            y, s, mean, rstd = out
            return y, s, mean if layer else None, rstd

        y, s = grad.AddNormFunction.apply(fwd, (kind, eps, offset, *meta, hot), x, r, w, b)
        return (y, s) if return_sum else y

    if layer:
        def run_layer(x: Any, r: Any, w: Any, b: Any, eps: Any, return_sum: bool) -> Any:
            return run(x, r, w, b, eps, 0.0, return_sum)

        def recorded_layer(x: Any, r: Any, w: Any, b: Any, eps: Any, return_sum: bool) -> Any:
            return recorded(x, r, w, b, eps, 0.0, return_sum)

        entry, entry_grad = run_layer, recorded_layer
    else:
        def run_rms(x: Any, r: Any, w: Any, eps: Any, offset: Any, return_sum: bool) -> Any:
            return run(x, r, w, None, eps, offset, return_sum)

        def recorded_rms(x: Any, r: Any, w: Any, eps: Any, offset: Any, return_sum: bool) -> Any:
            return recorded(x, r, w, None, eps, offset, return_sum)

        entry, entry_grad = run_rms, recorded_rms
    return KernelRoute(entry, f"{plan.variant} {plan.config}; with autograd: {grad_plan.config}",
                       autograd_run=entry_grad)
