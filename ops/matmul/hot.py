"""Routes of matmul/linear: what a repeated call with the same signature runs (``ops/route.py``).

A kernel route's ``run`` allocates the result and launches a plan's kernels with the call's
tensors, skipping checks, planning and Triton's Python launcher (see ``ops/op.py`` and
``xkernels/launch.py``). It returns ``None`` whenever its per-call preconditions fail (alignment
of the call's data pointers, torch's TF32 setting, a launch hook installed), and the front door
takes the full path for that call. Every ``run`` takes the op's arguments in ``params`` order:
``(a, b, out)`` for matmul, whose ``out`` (always ``None`` on a route) lands in the unused
``bias`` slot of the shared entries; ``(x, weight, bias, activation, negative_slope, out)`` for
linear.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from xkernels.backend import Backend
from xkernels.backends.cuda_launch import Descriptor
from xkernels.launch import ByValue
from xkernels.ops.layout import contiguous_strides, prod
from xkernels.ops.matmul.plan import MatmulPlan, precision
from xkernels.ops.matmul.vendor import epilogue_linear, reference_linear
from xkernels.ops.native_front_door import ABSENT, RESULT, NativeSpec, kernel_spec
from xkernels.ops.route import AtenRoute, KernelRoute, Route, VendorRoute

if TYPE_CHECKING:
    from xkernels.ops.matmul.ops import MatmulCall


def make_hot(plan: MatmulPlan, call: MatmulCall, canon: tuple[Any, ...]) -> Route | None:
    """The route of a call's signature: the vendor plan's PyTorch call; else, with no ``out`` and
    the operands used in place (no copies or folds), allocate the result and launch. ``None``
    (the signature's repeats keep the full path) otherwise.

    ``canon`` is the call's arguments in ``params`` order: (a, b, out) for matmul, (x, weight,
    bias, activation, negative_slope, residual, out) for linear (a call with a residual has no
    entry: ``Linear.make_hot``); the kernel's a/b operands are views of the
    first two sharing their data pointers. The route takes the bias and leaky_relu's slope per
    call."""
    a, b = canon[0], canon[1]
    if plan.vendor and call.out is None:
        return _hot_vendor(plan, call)
    if (call.out is not None or plan.materialize or plan.align_a or plan.align_b
            or not all(isinstance(t, torch.Tensor) for t in (a, b)) or prod(call.out_shape) == 0
            or call.a.data_ptr() != a.data_ptr() or call.b.data_ptr() != b.data_ptr()):
        return None
    detail = f"{plan.variant} {plan.config}"
    if plan.tma is not None:
        entry = _hot_tma(plan, call, a, b)
        return None if entry is None else KernelRoute(entry, detail)  # None: not compiled for these specs
    if plan.reduce_launcher is not None:
        return KernelRoute(_hot_split(plan, call), detail)
    return KernelRoute(_hot_pointer(plan, call), detail)


def _result_layout(call: MatmulCall, backend: Any) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    """Size, strides and allocator of the result (contiguous, as the full path allocates it)."""
    size = tuple(call.out_shape)
    return size, contiguous_strides(size), backend.allocator(call.device)


def _slope_of(call: MatmulCall) -> bool:
    """Whether the slope matters (leaky_relu): then it is taken per call."""
    return call.activation == "leaky_relu"


def _hot_pointer(plan: MatmulPlan, call: MatmulCall) -> Any:
    out_shape, dtype, device, backend = call.out_shape, call.dtype, call.device, plan.backend
    c = torch.empty(out_shape, dtype=dtype, device=device)
    size, stride, alloc = _result_layout(call, backend)
    leaky, fixed_slope = _slope_of(call), call.slope
    by_slope = ByValue(lambda slope: plan.launcher.hot(plan.args(call.a, call.b, c, call.bias, float(slope)), 4))
    launch = by_slope(fixed_slope)
    has_bias, planned = call.bias is not None, plan.constexprs["PRECISION"]
    follows_setting = dtype == torch.float32

    def hot(a: torch.Tensor, b: torch.Tensor, bias: Any = None, activation: Any = None, slope: Any = 0.01,
            residual: None = None, out: None = None) -> torch.Tensor | None:
        if follows_setting and precision(backend, dtype) != planned:
            return None  # torch's TF32 setting changed since this was planned
        c = alloc(size, stride, dtype)
        return c if (by_slope(slope) if leaky else launch)(a, b, c, bias if has_bias else c) else None

    # (where fp32 follows torch's TF32 setting, Python checks it per call: no native form)
    if not (follows_setting and _follows_tf32(backend)):
        hot.native = lambda canon: _launch_native(by_slope(_canon_slope(canon)) if leaky else launch, call, size, stride,
                                                  has_bias)
    return hot


def _follows_tf32(backend: Any) -> bool:
    """Whether ``backend``'s fp32 matmul precision follows a torch setting that may change."""
    return type(backend).fp32_matmul_precision is not Backend.fp32_matmul_precision


def _canon_slope(canon: tuple[Any, ...]) -> Any:
    """leaky_relu's slope of a linear call (``params``: x, weight, bias, activation, negative_slope, ...)."""
    return float(canon[4]) if len(canon) > 4 else 0.01


def _launch_native(launch: Any, call: MatmulCall, size: tuple[int, ...], stride: tuple[int, ...],
                   has_bias: bool) -> NativeSpec | None:
    """The native front door's form of a kernel route launching ``(a, b, c, bias or c)``."""
    return kernel_spec(launch, call.device, (0, 1, RESULT, 2 if has_bias else RESULT), size, stride, call.dtype)


def _hot_vendor(plan: MatmulPlan, call: MatmulCall) -> VendorRoute:
    """The route of a vendor-BLAS plan: the PyTorch call, without checks or planning. Where a
    gradient is required the front door runs its ``autograd_run``: PyTorch ops autograd records
    (aten's backward, no Python ``autograd.Function``); for a bias + activation the BLAS applies
    in its epilogue (``plan.epilogue``, no derivative defined) that is the unfused composition
    (a :class:`VendorRoute`). Without a fused epilogue the route is exactly the aten call (an
    :class:`AtenRoute`): ``enable()``'s overrides hand such calls to aten directly."""
    if plan.op == "matmul":
        def matmul_entry(a: torch.Tensor, b: torch.Tensor, out: None = None) -> torch.Tensor:
            return torch.matmul(a, b)

        # the table runs mm / bmm on the caller's operands: only where the check kept their shapes
        # (no batch folded into M, no 1-D operand promoted: the result has the operands' rank)
        a, b = call.a, call.b
        kept = len(call.out_shape) == a.dim() == b.dim()
        if kept and (a.dim() == 2 or (a.dim() == 3 and a.shape[0] == b.shape[0])):
            spec = NativeSpec("matmul", tensors=(0, 1), size=tuple(call.out_shape))  # mm / bmm, as torch.matmul
            matmul_entry.native = lambda canon: spec  # type: ignore[attr-defined]
        return AtenRoute(matmul_entry, "torch.matmul")
    activation, leaky, fixed_slope = call.activation, _slope_of(call), call.slope

    if activation is None:
        linear_only = torch.nn.functional.linear

        def hot(x: torch.Tensor, weight: torch.Tensor, bias: Any = None, act: Any = None, slope: Any = 0.01,
                residual: None = None, out: None = None) -> torch.Tensor:
            return linear_only(x, weight, bias)

        hot.native = _linear_native  # type: ignore[attr-defined]
    else:
        def hot(x: torch.Tensor, weight: torch.Tensor, bias: Any = None, act: Any = None, slope: Any = 0.01,
                residual: None = None, out: None = None) -> torch.Tensor:
            return reference_linear(x, weight, bias, activation, float(slope) if leaky else fixed_slope)

    if not plan.epilogue:
        if activation is not None:  # F.linear, then PyTorch's activation (in place natively: the same op)
            hot.native = lambda canon: _linear_native(canon, activation, _canon_slope(canon) if leaky else fixed_slope)
        return AtenRoute(hot, "F.linear") if activation is None else VendorRoute(hot, f"F.linear + {activation}")
    epilogue, out_shape, folded = plan.epilogue, call.out_shape, call.a.shape

    def fused(x: torch.Tensor, weight: torch.Tensor, bias: Any = None, act: Any = None, slope: Any = 0.01,
              residual: None = None, out: None = None) -> torch.Tensor:
        return epilogue_linear(x if x.dim() == 2 else x.reshape(folded), weight.t(), bias, epilogue).view(out_shape)

    if call.bias is not None:  # (without one the epilogue adds a shared zero bias: Python keeps it)
        fused.native = lambda canon: _linear_native(canon, epilogue, 0.01, blas_epilogue=True)
    return VendorRoute(fused, f"BLAS epilogue {epilogue}", autograd_run=hot)


def _linear_native(canon: tuple[Any, ...], activation: str | None = None, slope: float = 0.01,
                   blas_epilogue: bool = False) -> NativeSpec | None:
    """``F.linear``'s BLAS call in the native front door (``addmm_out`` / ``mm_out`` of the input
    folded to 2-D, as ``F.linear`` folds it), then ``activation`` as PyTorch's op, or in the
    BLAS's epilogue (``_addmm_activation_out``, as ``epilogue_linear``): for a 2-D or contiguous
    input, a 2-D weight and a 1-D bias or none."""
    x, weight, bias = canon[0], canon[1], canon[2]
    if x.dim() < 2 or weight.dim() != 2 or (x.dim() > 2 and not x.is_contiguous()) or (bias is not None
                                                                                     and bias.dim() != 1):
        return None
    return NativeSpec("linear", tensors=(0, 1, ABSENT if bias is None else 2),
                      size=(*x.shape[:-1], weight.shape[0]), activation=activation, slope=float(slope),
                      epilogue=blas_epilogue)


def _hot_split(plan: MatmulPlan, call: MatmulCall) -> Any:
    """The hot entry of a split-K plan: allocate C and the workspace, launch both kernels (the
    reduction applies bias and activation: per slope value for leaky_relu)."""
    reducer = plan.reduce_launcher
    assert reducer is not None
    out_shape, dtype, device, backend = call.out_shape, call.dtype, call.device, plan.backend
    ws, c = plan.workspace(device), torch.empty(out_shape, dtype=dtype, device=device)
    size, stride, alloc = _result_layout(call, backend)
    main = plan.launcher.hot(plan.args(call.a, call.b, ws, None, call.slope), 4)
    leaky, fixed_slope = _slope_of(call), call.slope
    by_slope = ByValue(lambda slope: reducer.hot(plan.reduce_args(ws, c, call.bias, float(slope)), 3))
    fixed_reduce = by_slope(fixed_slope)
    has_bias, planned = call.bias is not None, plan.constexprs["PRECISION"]
    follows_setting = dtype == torch.float32

    def hot(a: torch.Tensor, b: torch.Tensor, bias: Any = None, activation: Any = None, slope: Any = 0.01,
            residual: None = None, out: None = None) -> torch.Tensor | None:
        if follows_setting and precision(backend, dtype) != planned:
            return None  # torch's TF32 setting changed since this was planned
        s = float(slope) if leaky else fixed_slope
        ws, c = plan.workspace(device), alloc(size, stride, dtype)
        if not main(a, b, ws, ws):
            return None
        if not (by_slope(s) if leaky else fixed_reduce)(ws, c, bias if has_bias else ws):
            # the partials are written: finish ordinarily
            reducer(*plan.reduce_args(ws, c, bias if has_bias else None, s))
        return c

    return hot


class _HostDescriptor(NamedTuple):
    """What Triton 3.6's launcher reads of a ``TensorDescriptor`` argument (base, shape, strides,
    padding), without its per-object validation (~10 us a descriptor on an H100 host): for hot
    entries, whose shapes and strides were validated by the first call's real descriptors."""

    base: torch.Tensor
    shape: list[int]
    strides: list[int]
    block_shape: list[int]
    padding: str = "zero"


def _hot_tma(plan: MatmulPlan, call: MatmulCall, a_arg: torch.Tensor, b_arg: torch.Tensor) -> Any:
    """The hot entry of a TMA plan: a launch record that encodes the three tensor maps from the
    call's base pointers (``cuda_launch``), or else the three descriptors built from the call's
    tensors (the shapes, strides and block shapes are the first call's) launched through
    Triton's compiled launcher. Bases must stay 16-byte aligned and the bias's alignment class the same, or the
    full path runs (it copies misaligned bases). A read M-major (``a_mmajor``) is the call's
    2-D ``a`` transposed."""
    t = plan.tma
    assert t is not None
    (M, N, K), dtype, device = plan.dims, call.dtype, call.device
    has_bias, fixed_slope = call.bias is not None, call.slope
    # the launch's specs: descriptors have none (None stands in: this call's bases may be the
    # misaligned ones the full path copied), the bias pointer its alignment, M/N/K their classes
    spec_args = (None, None, None, call.bias if has_bias else torch.empty(16, dtype=dtype, device=device),
                 M, N, K, float(fixed_slope))
    launch = plan.launcher.hot_run(spec_args)
    if launch is None:
        return None
    # B's descriptor base: the (N, K) weight when K-contiguous, else (K, N); the call's b is
    # either (linear's weight, matmul's transposed view), fixed by the entry's strides
    b_flip = t["b_kmajor"] and tuple(b_arg.shape) == (K, N) and b_arg.stride() == call.b.stride()
    bias_aligned = call.bias.data_ptr() % 16 == 0 if has_bias else True
    a_mmajor = t["a_mmajor"]
    if a_mmajor and a_arg.dim() != 2:  # a folded (B, S, K) x read M-major: the full path
        return None
    a_st = call.a.stride(1) if a_mmajor else call.a.stride(0)
    b_base = call.b.t() if t["b_kmajor"] else call.b
    b_shape, b_st = list(b_base.shape), [b_base.stride(0), 1]
    a_shape, c_shape = ([K, M] if a_mmajor else [M, K]), [M, N]

    leaky = _slope_of(call)
    size, stride, alloc = _result_layout(call, plan.backend)
    # one C call per launch where it can be made (the slope is packed into it: not for leaky_relu):
    # the tensor maps encoded from the call's base pointers, as Triton's launcher would
    record = None if leaky else plan.launcher.descriptor_record(
        spec_args, (0, 1, 2, 3), {0: Descriptor(tuple(a_shape), (a_st, 1)), 1: Descriptor(tuple(b_shape), tuple(b_st)),
                                  2: Descriptor(tuple(c_shape), (N, 1))})

    def hot(a: torch.Tensor, b: torch.Tensor, bias: Any = None, activation: Any = None, slope: Any = 0.01,
            residual: None = None, out: None = None) -> torch.Tensor | None:
        c = alloc(size, stride, dtype)
        if record is not None and record(a, b, c, bias if has_bias else c):
            return c
        if (a.data_ptr() | b.data_ptr()) & 15 or (has_bias and (bias.data_ptr() % 16 == 0) != bias_aligned):
            return None
        s = float(slope) if leaky else fixed_slope  # a float argument: no specialisation to keep
        descs = (_HostDescriptor(a.t() if a_mmajor else a if a.dim() == 2 else a.view(M, K), a_shape, [a_st, 1],
                                 t["a"]),
                 _HostDescriptor(b.t() if b_flip else b, b_shape, b_st, t["b"]),
                 _HostDescriptor(c if c.dim() == 2 else c.view(M, N), c_shape, [N, 1], t["c"]))
        return c if launch(*descs, bias if has_bias else c, M, N, K, s) else None

    if record is not None:  # the tensor maps are encoded in C++ from the call's base pointers
        hot.native = lambda canon: _launch_native(record, call, size, stride, has_bias)
    return hot
