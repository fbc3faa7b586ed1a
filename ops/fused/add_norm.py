"""``add_layer_norm`` / ``add_rms_norm``: the residual add fused with the normalization after it.

    y, s = add_layer_norm(x, residual, weight=None, bias=None, eps=1e-5, *, return_sum=True)
    y, s = add_rms_norm(x, residual, weight=None, eps=1e-6, *, offset=0.0, return_sum=True)

``s = x + residual`` (``residual=None``: ``s = x``), in torch's promoted dtype of the two;
``y`` = LayerNorm / RMSNorm of ``s`` over the last dim ``N``, in ``s``'s dtype, statistics in
fp32 (float64 for float64 inputs): LayerNorm as ``F.layer_norm(s, (N,), weight, bias, eps)``,
RMSNorm ``s * rsqrt(mean(s^2, -1) + eps) * (offset + weight)`` (``offset=1.0``: Gemma's
``1 + weight``). ``return_sum=False`` returns ``y`` alone and never writes ``s``.

Routing is the Op front door's (``ops/op.py``): the Triton kernel (``add_norm_kernels.py``) on
backends that run Triton for fp16/bf16/fp32 operands; PyTorch on the cpu backend and for other
float dtypes (float64). ``Op`` fits with one change: its compiled path looks for an ``out``
parameter, which these ops do not have, so ``_compiled`` calls the custom op directly. Results are
tuples where ``return_sum`` asks for one; nothing in the front door needs a single tensor.
A call that ran the kernel leaves its signature's route (``make_hot``, ``add_norm_route.py``):
repeats, with or without a gradient required, allocate and launch without check or plan lookup;
a call requiring grad records the op's ``autograd.Function`` either way (``_recorded``).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
import torch.nn.functional as F

from xkernels.backend import Backend
from xkernels.ops import checks
from xkernels.ops.fused import add_norm_grad as grad
from xkernels.ops.fused.add_norm_plan import KERNEL_DTYPES, AddNormCall, AddNormPlan, plan_key
from xkernels.ops.op import Op, Param, Plan
from xkernels.ops.route import KernelRoute, Route
from xkernels.registry import registry
from xkernels.tuning import _forced


def _describe_dtype(name: str, t: torch.Tensor, op: str) -> None:
    if not t.dtype.is_floating_point:
        raise TypeError(f"xkernels.ops.{op}: '{name}' has dtype {t.dtype}; {op} takes floating-point tensors")


class AddNormOp(Op):
    """Shared checks, routing and autograd of the two fused ops; subclasses set ``kind``."""

    kind = "layer"

    # -- checks ---------------------------------------------------------------------------------
    def _check(self, x: Any, residual: Any, weight: Any, bias: Any, eps: Any, offset: Any,
               return_sum: Any) -> AddNormCall:
        op = self.name
        checks.require_tensor(op, "x", x)
        named = {"x": x}
        for name, v in (("residual", residual), ("weight", weight), ("bias", bias)):
            if v is not None:
                checks.require_tensor(op, name, v)
                named[name] = v
        for name, t in named.items():
            _describe_dtype(name, t, op)
        if x.dim() == 0:
            raise ValueError(f"xkernels.ops.{op}: 'x' is 0-d; it needs a last dim to normalize over")
        devices = {n: t.device for n, t in named.items()}
        if len(set(devices.values())) > 1:
            listing = ", ".join(f"'{n}' on {d}" for n, d in devices.items())
            raise ValueError(f"xkernels.ops.{op}: tensors must be on one device, got {listing}")
        if residual is not None and residual.shape != x.shape:
            shape = checks.broadcast_shape(op, {"x": x.shape, "residual": residual.shape})
            if shape != x.shape:
                raise ValueError(f"xkernels.ops.{op}: 'residual' of shape {tuple(residual.shape)} would grow 'x' of "
                                 f"shape {tuple(x.shape)} to {tuple(shape)}; residual must broadcast to x's shape")
        n = x.shape[-1]
        for name in ("weight", "bias"):
            t = named.get(name)
            if t is not None and tuple(t.shape) != (n,):
                raise ValueError(f"xkernels.ops.{op}: '{name}' has shape {tuple(t.shape)}, expected ({n},): the "
                                 f"length of x's last dim (x has shape {tuple(x.shape)})")
        for name, v in (("eps", eps), ("offset", offset)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"xkernels.ops.{op}: '{name}' must be a real number, got {checks.describe(v)}")
        if not isinstance(return_sum, bool):
            raise TypeError(f"xkernels.ops.{op}: 'return_sum' must be a bool, got {checks.describe(return_sum)}")
        if offset != 0 and weight is None:
            raise ValueError(f"xkernels.ops.{op}: 'offset' {offset!r} scales (offset + weight), but 'weight' is None; "
                             f"pass a weight, or offset=0.0")
        dtype = x.dtype if residual is None else torch.result_type(x, residual)
        kinds = [t.dtype for t in named.values()]
        kernel_ok = dtype in KERNEL_DTYPES and all(d in KERNEL_DTYPES for d in kinds)
        reason = "" if kernel_ok else (f"dtypes {', '.join(f'{n} {t.dtype}' for n, t in named.items())} have no "
                                       f"Triton kernel (fp16, bf16, fp32); PyTorch computes it")
        return AddNormCall(op, self.kind, x, residual, weight, bias, float(eps), float(offset), return_sum, dtype,
                           x.device, kernel_ok, reason, store_sum=return_sum)

    # -- routing --------------------------------------------------------------------------------
    def torch_impl(self, call: AddNormCall) -> Any:
        y, s, _, _ = torch_forward(call)
        return (y, s) if call.return_sum else y

    def plan_key(self, call: AddNormCall, backend: Backend) -> Any:
        return plan_key(call, backend)

    def make_plan(self, call: AddNormCall, backend: Backend) -> Plan:
        return AddNormPlan(backend, call)

    def run_plan(self, plan: Plan, call: AddNormCall) -> Any:
        assert isinstance(plan, AddNormPlan)
        y, s, _, _ = plan.run(call)
        return (y, s) if call.return_sum else y

    def make_hot(self, plan: Plan, call: AddNormCall, canon: tuple[Any, ...]) -> KernelRoute | None:
        """The signature's route (``add_norm_route.py``): ``run`` and ``autograd_run`` take the
        call's arguments in ``params`` order; ``eps``/``offset`` are passed per call."""
        from xkernels.ops.fused.add_norm_route import make_route

        assert isinstance(plan, AddNormPlan)
        return make_route(self, plan, call)

    def _recorded(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``Op._recorded`` for these ops: the signature's route records the autograd Function
        itself (its ``autograd_run``); a call without one records it through the full path and
        then leaves its signature's route, as a call without grad does (training never takes the
        no-grad path)."""
        found = self.find_hot(args, kwargs)
        if found is not None:
            return self.record(found[1], found[2])
        call = self._check_canon(self._bind(args, kwargs))
        result = grad.recorded(self, call)
        if _forced.get() is None:
            route = self._decide(call)[1]
            if isinstance(route, AddNormPlan):
                self._remember(args, kwargs, route, call)
        return result

    def record(self, route: Route, canon: tuple[Any, ...]) -> Any:
        """``Op.record`` for these ops: the route's ``autograd_run``; where it declines (``None``)
        or there is none, the full path's recorded forward (checks and all)."""
        if route.autograd_run is not None:
            result = route.autograd_run(*canon)
            if result is not None:
                return result
        return grad.recorded(self, self._check_canon(canon))

    def forward_all(self, call: AddNormCall) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                                                      torch.Tensor | None]:
        """(y, s, mean, rstd) for autograd and the custom op: s when ``call.store_sum``, the
        statistics where the route produces them (``None``: the backward recomputes them)."""
        call.store_stats = True
        backend = self._backend(call)
        impl = registry.op_impl(self.name, backend.name)
        if impl is not None:
            y, s = self._plugin(impl, call)
            return y, s if call.store_sum else None, None, None
        if not backend.runs_triton or not call.kernel_ok:
            return torch_forward(call)
        plan = self.plan(call, backend)
        assert isinstance(plan, AddNormPlan)
        return plan.run(call)

    def _plugin(self, impl: Any, call: AddNormCall) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def compile_cases(self, target: Any) -> Any:
        """The npu compilations of ``add_norm.json``'s entries (``ops/fused/add_norm_compile.py``)."""
        from xkernels.ops.fused.add_norm_compile import add_norm_cases

        return add_norm_cases(self, target)

    def _check_canon(self, canon: tuple[Any, ...]) -> AddNormCall:
        raise NotImplementedError

    # -- autograd and torch.compile --------------------------------------------------------------
    def _compiled(self, canon: tuple[Any, ...]) -> Any:
        """``Op._compiled`` without ``out=``: the registered custom op (one graph node)."""
        return grad.compiled(self, canon)


class AddLayerNorm(AddNormOp):
    """``s = x + residual``; ``y = F.layer_norm(s, (N,), weight, bias, eps)``; ``(y, s)`` or ``y``."""

    name = "add_layer_norm"
    kind = "layer"
    params = (Param("x"), Param("residual"), Param("weight", None), Param("bias", None),
              Param("eps", 1e-5, key="type"), Param("return_sum", True, positional=False, key="value"))

    def check(self, x: Any, residual: Any, weight: Any = None, bias: Any = None, eps: Any = 1e-5, *,
              return_sum: Any = True) -> AddNormCall:
        return self._check(x, residual, weight, bias, eps, 0.0, return_sum)

    def _check_canon(self, canon: tuple[Any, ...]) -> AddNormCall:
        x, residual, weight, bias, eps, return_sum = canon
        return self.check(x, residual, weight, bias, eps, return_sum=return_sum)

    def autograd(self, canon: tuple[Any, ...], route: Route | None = None) -> Any:
        return grad.recorded(self, self._check_canon(canon))

    def library_call(self, canon: tuple[Any, ...]) -> Any:
        x, residual, weight, bias, eps, return_sum = canon
        y, s, _, _ = torch.ops.xkernels.add_layer_norm.default(x, residual, weight, bias, eps, return_sum)
        return (y, s) if return_sum else y

    def _plugin(self, impl: Any, call: AddNormCall) -> tuple[torch.Tensor, torch.Tensor]:
        return impl.fn(call.x, call.residual, call.weight, call.bias, call.eps, return_sum=True)


class AddRmsNorm(AddNormOp):
    """``s = x + residual``; ``y = s * rsqrt(mean(s^2, -1) + eps) * (offset + weight)``."""

    name = "add_rms_norm"
    kind = "rms"
    params = (Param("x"), Param("residual"), Param("weight", None), Param("eps", 1e-6, key="type"),
              Param("offset", 0.0, positional=False, key="type"),
              Param("return_sum", True, positional=False, key="value"))

    def check(self, x: Any, residual: Any, weight: Any = None, eps: Any = 1e-6, *, offset: Any = 0.0,
              return_sum: Any = True) -> AddNormCall:
        return self._check(x, residual, weight, None, eps, offset, return_sum)

    def _check_canon(self, canon: tuple[Any, ...]) -> AddNormCall:
        x, residual, weight, eps, offset, return_sum = canon
        return self.check(x, residual, weight, eps, offset=offset, return_sum=return_sum)

    def autograd(self, canon: tuple[Any, ...], route: Route | None = None) -> Any:
        return grad.recorded(self, self._check_canon(canon))

    def library_call(self, canon: tuple[Any, ...]) -> Any:
        x, residual, weight, eps, offset, return_sum = canon
        y, s, _, _ = torch.ops.xkernels.add_rms_norm.default(x, residual, weight, eps, offset, return_sum)
        return (y, s) if return_sum else y

    def _plugin(self, impl: Any, call: AddNormCall) -> tuple[torch.Tensor, torch.Tensor]:
        return impl.fn(call.x, call.residual, call.weight, call.eps, offset=call.offset, return_sum=True)


def torch_forward(call: AddNormCall) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """PyTorch's (y, s or None, mean, rstd): s rounded to its dtype, statistics and y in fp32
    (float64 for float64), y cast to s's dtype. The cpu backend's route and the reference of
    the fallback dtypes."""
    x, r = call.x, call.residual
    s = (x.clone(memory_format=torch.contiguous_format) if call.store_sum else x) if r is None else x + r
    if s.dtype != call.dtype:
        s = s.to(call.dtype)
    s = s.contiguous()  # results are contiguous on every route (the kernels write them so)
    wide = torch.float64 if call.dtype == torch.float64 else torch.float32
    y, mean, rstd = normalize(s.to(wide), call.kind, call.weight, call.bias, call.eps, call.offset,
                              call.store_stats)
    return y.to(call.dtype).contiguous(), s if call.store_sum else None, mean, rstd


def normalize(s: torch.Tensor, kind: str, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
              offset: float, stats: bool = True) -> tuple[torch.Tensor, Any, Any]:
    """(y, mean, rstd) of ``s`` (already in the compute dtype) over its last dim; mean and rstd
    flattened to one per row (no mean for RMSNorm), ``None`` unless ``stats``."""
    n = s.shape[-1]
    w = None if weight is None else weight.to(s.dtype)
    rows = s.reshape(-1, n)
    if kind == "layer":
        y = F.layer_norm(s, (n,), w, None if bias is None else bias.to(s.dtype), eps)
        if not stats:
            return y, None, None
        var, mean = torch.var_mean(rows, dim=1, correction=0)
        return y, mean, torch.rsqrt(var + eps)
    rstd = torch.rsqrt(rows.square().mean(1) + eps)
    y = s * rstd.reshape(*s.shape[:-1], 1)
    if w is not None:
        y = y * (w + offset) if offset else y * w
    return y, None, rstd if stats else None


add_layer_norm = AddLayerNorm()
add_rms_norm = AddRmsNorm()
