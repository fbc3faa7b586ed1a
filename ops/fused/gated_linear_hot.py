"""Routes of ``gated_linear``: what a repeated call with the same signature runs (``ops/route.py``).

A route is built from the first call's plan and checked call (``GatedLinear.make_hot``) and takes
every repeat's arguments in ``params`` order, ``(x, weight, up_weight, bias, up_bias,
activation)``. Everything the signature fixes is computed once: the result's shape and strides,
M/N/K, the gate/up split of a concatenated weight, the launch's fixed arguments and constexprs.
Per call: the weight (and bias) halves of a concatenated weight as views, the result's
allocation, the launch.

* :class:`~xkernels.ops.route.VendorRoute` (a ``{"VENDOR": true}`` plan): ``F.linear`` (the
  device's BLAS, one GEMM against a concatenated weight, two otherwise), then the gate kernel.
  Where a gradient is required the front door runs the route's ``autograd_run``: the same
  GEMM(s) and gate kernel with gate and up kept, recorded by the op's ``autograd.Function``, whose
  backward reads them in one element-wise kernel (``gate_grad_kernel``).
* :class:`~xkernels.ops.route.KernelRoute` (the fused kernel, pointer or TMA variant): allocate
  the result, launch. A call needing a gradient takes the op's ``autograd.Function`` (which keeps
  gate and up for the backward: another plan).

``None`` (the call takes the full path): a float32 kernel route whose TF32 setting changed since
planning. ``make_hot`` gives no route (repeats keep the full path) for an empty result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from xkernels.ops.layout import contiguous_strides
from xkernels.ops.matmul.hot import _HostDescriptor
from xkernels.ops.matmul.plan import precision
from xkernels.ops.route import KernelRoute, Route, VendorRoute

if TYPE_CHECKING:
    from xkernels.backend import Backend
    from xkernels.ops.fused.gated_linear import GatedCall
    from xkernels.ops.fused.gated_linear_plan import GatedPlan

_linear = torch.nn.functional.linear


def allocator(backend: Backend, device: torch.device) -> Any:
    """``(size, stride, dtype) -> tensor``: how a route allocates its result (one place, so that
    tests can hand out NaN-filled memory)."""
    return backend.allocator(device)


class _Operands(NamedTuple):
    """What ``GatedPlan.descriptors`` reads of a call."""

    x2: torch.Tensor
    wg: torch.Tensor
    wu: torch.Tensor


def make_hot(plan: GatedPlan, call: GatedCall, canon: tuple[Any, ...], function: Any) -> Route | None:
    """The route of ``call``'s signature (module doc); ``None`` for an empty result. ``function``:
    the op's ``autograd.Function``, which the vendor route's calls needing a gradient go through."""
    if call.empty:
        return None
    detail = f"{plan.variant} {plan.config}"
    if plan.vendor:
        return VendorRoute(_vendor(plan, call), detail, autograd_run=_vendor_training(plan, call, function))
    if plan.tma is not None:
        return KernelRoute(_tma(plan, call), detail)
    return KernelRoute(_pointer(plan, call, canon[0]), detail)


def _vendor_training(plan: GatedPlan, call: GatedCall, function: Any) -> Any:
    """A call needing a gradient on the vendor route: the same BLAS GEMM(s) and gate kernel, gate
    and up kept, recorded by the op's ``autograd.Function``, whose backward reads them in one
    element-wise kernel. (PyTorch's composition ``act(gate) * up``, which autograd would record
    instead, writes act(gate) and keeps it, and its backward makes three element-wise passes.)"""
    M, N, _ = plan.dims
    size, stride, alloc = _result(plan, call)
    dtype, backend, gate_args, launch = call.dtype, plan.backend, plan.gate_dims, plan.launcher
    concatenated = call.concatenated

    def saving(x: torch.Tensor, weight: torch.Tensor, up_weight: Any, bias: Any, up_bias: Any) -> tuple[Any, ...]:
        if concatenated:
            g = _linear(x, weight, bias)  # (..., 2N): the gate kernel reads rows of 2N
            gate, u = g.narrow(-1, 0, N), g.narrow(-1, N, N)
        else:
            g = gate = _linear(x, weight, bias)
            u = _linear(x, up_weight, up_bias)
        y = alloc(size, stride, dtype)
        launch(g, u, y, *gate_args)
        return y, gate.reshape(M, N), u.reshape(M, N), backend

    def training(x: torch.Tensor, weight: torch.Tensor, up_weight: Any = None, bias: Any = None, up_bias: Any = None,
                 activation: Any = None) -> torch.Tensor:
        return function.apply(lambda: saving(x, weight, up_weight, bias, up_bias), x, weight, up_weight, bias,
                              up_bias, activation)

    return training


def _result(plan: GatedPlan, call: GatedCall) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    """Size, strides and allocator of the result (``x.shape[:-1] + (I,)``, contiguous: the (M, I)
    rows the kernels write)."""
    size = tuple(call.out_shape)
    return size, contiguous_strides(size), allocator(plan.backend, call.device)


def _vendor(plan: GatedPlan, call: GatedCall) -> Any:
    """F.linear on ``x`` as given (its result is the contiguous ``(*lead, N)`` or ``(*lead, 2N)``
    whose rows the planned gate strides describe), then the gate kernel on the pointers."""
    M, N, _ = plan.dims
    size, stride, alloc = _result(plan, call)
    dtype = call.dtype
    gate_args = plan.gate_dims
    placeholder = torch.empty(0, dtype=dtype, device=call.device)
    launch = plan.launcher.hot((placeholder, placeholder, placeholder, *gate_args), 3)
    slow = plan.launcher

    if call.concatenated:
        def vendor_concatenated(x: torch.Tensor, weight: torch.Tensor, up_weight: Any = None, bias: Any = None,
                                up_bias: Any = None, activation: Any = None) -> torch.Tensor:
            g = _linear(x, weight, bias)  # (..., 2N): gate columns first; the kernel reads rows of 2N
            u = g.narrow(-1, N, N)
            y = alloc(size, stride, dtype)
            if not launch(g, u, y):
                slow(g, u, y, *gate_args)
            return y

        return vendor_concatenated

    def vendor_separate(x: torch.Tensor, weight: torch.Tensor, up_weight: Any = None, bias: Any = None,
                        up_bias: Any = None, activation: Any = None) -> torch.Tensor:
        g, u = _linear(x, weight, bias), _linear(x, up_weight, up_bias)
        y = alloc(size, stride, dtype)
        if not launch(g, u, y):
            slow(g, u, y, *gate_args)
        return y

    return vendor_separate


def _folding(call: GatedCall, x: torch.Tensor) -> tuple[int, int] | None:
    """``(M, K)`` where each call must fold ``x`` itself (a copy: its leading dims do not merge);
    ``None`` where ``x`` as given has the rows the plan reads (2-D, or a fold that is a view of
    it: the pointer kernel takes the pointer and the planned strides)."""
    if x.dim() == 2 or call.x2.data_ptr() == x.data_ptr():
        return None
    return (call.x2.shape[0], call.x2.shape[1])


def _pointer(plan: GatedPlan, call: GatedCall, x0: torch.Tensor) -> Any:
    """The fused pointer kernel: (x, wg, wu, y, bg, bu, g, u) pointers, everything else fixed (y
    stands in for absent biases and for gate/up, which a call without a gradient does not keep)."""
    M, N, K = plan.dims
    size, stride, alloc = _result(plan, call)
    dtype, backend, planned = call.dtype, plan.backend, plan.constexprs["PRECISION"]
    follows_setting = dtype == torch.float32
    fold = _folding(call, x0)
    p = torch.empty(0, dtype=dtype, device=call.device)
    launch = plan.launcher.hot((p,) * 8 + (M, N, K, plan.tiles, plan.programs, *plan.strides), 8)
    concatenated, has_bg, has_bu = call.concatenated, call.bg is not None, call.bu is not None

    def pointer(x: torch.Tensor, weight: torch.Tensor, up_weight: Any = None, bias: Any = None, up_bias: Any = None,
                activation: Any = None) -> torch.Tensor | None:
        if follows_setting and precision(backend, dtype) != planned:
            return None  # torch's TF32 setting changed since this was planned
        if fold is not None:
            x = x.reshape(fold)
        if concatenated:  # the gate half is the weight's own pointer
            up_weight = weight.narrow(0, N, N)
            if has_bg:
                up_bias = bias.narrow(0, N, N)
        y = alloc(size, stride, dtype)
        launch(x, weight, up_weight, y, bias if has_bg else y, up_bias if has_bu else y, y, y)
        return y

    return pointer


def _tma(plan: GatedPlan, call: GatedCall) -> Any:
    """The fused TMA kernel: descriptors of x, the weights and y built from the call's tensors
    (shapes, strides and block shapes fixed by the signature) and launched through Triton's
    compiled launcher (``Launcher.hot_run``), where the bases are 16-byte aligned and the biases'
    alignment is the planned one; otherwise Triton's own descriptors (which copy a misaligned
    base), as the full path launches."""
    t = plan.tma
    assert t is not None
    M, N, K = plan.dims
    size, stride, alloc = _result(plan, call)
    dtype, device = call.dtype, call.device
    has_bg, has_bu, concatenated = call.bg is not None, call.bu is not None, call.concatenated
    stand_in = torch.empty(16, dtype=dtype, device=device)  # an aligned pointer for an absent bias
    bg0, bu0 = call.bg if has_bg else stand_in, call.bu if has_bu else stand_in
    aligned = (bg0.data_ptr() % 16 == 0, bu0.data_ptr() % 16 == 0)
    fast = plan.launcher.hot_run((None,) * 6 + (bg0, bu0, M, N, K))
    x_st, wg_st, wu_st = call.x2.stride(0), call.wg.stride(0), call.wu.stride(0)
    y2d = len(size) == 2
    slow = plan.launcher
    HD = _HostDescriptor

    def tma(x: torch.Tensor, weight: torch.Tensor, up_weight: Any = None, bias: Any = None, up_bias: Any = None,
            activation: Any = None) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(M, K)
        wg = weight
        if concatenated:
            wg, up_weight = weight.narrow(0, 0, N), weight.narrow(0, N, N)
            if has_bg:
                up_bias = bias.narrow(0, N, N)
        y = alloc(size, stride, dtype)
        y2 = y if y2d else y.view(M, N)
        bg, bu = bias if has_bg else y, up_bias if has_bu else y
        if (fast is not None and not (x2.data_ptr() | wg.data_ptr() | up_weight.data_ptr()) & 15
                and (bg.data_ptr() % 16 == 0, bu.data_ptr() % 16 == 0) == aligned):
            yd = HD(y2, [M, N], [N, 1], t["y"])
            if fast(HD(x2, [M, K], [x_st, 1], t["x"]), HD(wg, [N, K], [wg_st, 1], t["w"]),
                    HD(up_weight, [N, K], [wu_st, 1], t["w"]), yd, yd, yd, bg, bu, M, N, K):
                return y
        slow(*plan.descriptors(_Operands(x2, wg, up_weight), y2, None, None), bg, bu, M, N, K)  # type: ignore[arg-type]
        return y

    return tma
