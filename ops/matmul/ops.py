"""``matmul(a, b, *, out=None)`` with ``torch.matmul`` semantics, and ``linear(x, weight, bias=None,
activation=None, *, residual=None)`` = ``F.linear`` followed by the activation, fused into the
matmul epilogue, plus a residual added there too (``matmul/residual.py``).

This module is the ops' front: argument checks, the call record and the PyTorch fallback. Which
config a call runs and why: ``matmul/config.py``; how it launches: ``matmul/plan.py``; repeated
calls: ``matmul/hot.py``; the Triton sources: ``matmul/kernels.py``. Layout handling on the host:

* 1-D operands are promoted (``(K,)`` → ``(1, K)`` / ``(K, 1)``) and the extra dim dropped after;
* batch dims broadcast; a 2-D ``b`` under a batched contiguous ``a`` folds the batch into M;
* up to two batch dims run as they are (stride 0 where broadcast); more are collapsed or, when
  they cannot be, made contiguous first;
* float32 follows torch's TF32 setting for the device (``torch.backends.cuda.matmul.allow_tf32``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from xkernels.backend import Backend
from xkernels.ops import checks
from xkernels.ops.autograd import LinearFunction, MatmulFunction, reject_out
from xkernels.ops.layout import contiguous_strides
from xkernels.ops.matmul import evidence as matmul_evidence
from xkernels.ops.matmul import hot as matmul_hot
from xkernels.ops.matmul import pre_activation as matmul_pre
from xkernels.ops.matmul import residual as matmul_residual
from xkernels.ops.matmul.config import MATMUL_DEFAULT
from xkernels.ops.matmul.plan import ACTIVATIONS, MatmulPlan, precision
from xkernels.ops.matmul.vendor import activate, epilogue_linear, reference_linear
from xkernels.ops.op import Op, Param, Plan
from xkernels.ops.route import Explanation, Route

__all__ = ["ACTIVATIONS", "MATMUL_DEFAULT", "Linear", "Matmul", "MatmulCall", "linear", "matmul"]


@dataclass
class MatmulCall:
    a: torch.Tensor  # (..., M, K) after 1-D promotion
    b: torch.Tensor  # (..., K, N)
    bias: torch.Tensor | None
    activation: str | None
    slope: float
    out: torch.Tensor | None
    batch: torch.Size
    out_shape: torch.Size  # the user-visible result shape
    dtype: torch.dtype
    device: torch.device
    kernel_ok: bool
    fallback_reason: str = ""
    residual: torch.Tensor | None = None  # linear's, as given (broadcasts to out_shape)
    out_dtype: torch.dtype | None = None  # the result's dtype where a residual promotes it

    @property
    def result_dtype(self) -> torch.dtype:
        """The result's dtype: ``dtype`` (the operands'), or the residual's promotion of it."""
        return self.out_dtype or self.dtype


def _check_pair(op: str, a: Any, b: Any, names: tuple[str, str]) -> None:
    checks.require_tensor(op, names[0], a)
    checks.require_tensor(op, names[1], b)
    for n, t in zip(names, (a, b)):
        if t.dim() == 0:
            raise ValueError(f"xkernels.ops.{op}: '{n}' must have at least 1 dimension, got a 0-d tensor")
    if a.dtype != b.dtype:
        raise TypeError(f"xkernels.ops.{op}: '{names[0]}' and '{names[1]}' must have one dtype, "
                        f"got {a.dtype} and {b.dtype}")
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        raise TypeError(f"xkernels.ops.{op}: dtype {a.dtype} is not supported; use a floating-point dtype")


def _kernel_reason(dtype: torch.dtype) -> str:
    if dtype in checks.MATMUL_KERNEL_DTYPES:
        return ""
    return f"dtype {dtype} has no Triton matmul kernel; PyTorch computes it"


class _MatmulBase(Op):
    def torch_impl(self, call: MatmulCall) -> torch.Tensor:
        raise NotImplementedError

    def plan_key(self, call: MatmulCall, backend: Backend) -> Any:
        key = (backend.name, call.device, call.dtype, tuple(call.a.shape), call.a.stride(),
               tuple(call.b.shape), call.b.stride(), None if call.bias is None else call.bias.stride(),
               call.activation, precision(backend, call.dtype), tuple(call.batch),
               call.out is not None and call.out.is_contiguous())
        if call.residual is None:
            return key
        r = call.residual  # its layout is planned (strides, broadcast), its dtype may promote C
        return (*key, tuple(call.out_shape), tuple(r.shape), r.stride(), r.dtype)

    def make_plan(self, call: MatmulCall, backend: Backend, selection: Any = None) -> Plan:
        M, N = call.a.shape[-2], call.b.shape[-1]
        c_strides = contiguous_strides(tuple(call.batch) + (M, N))
        return MatmulPlan(self.name, backend, call, c_strides, selection)

    def settle(self, call: MatmulCall, backend: Backend, plan: Plan) -> Plan:
        """A plan that runs the BLAS for want of evidence is settled by a first-use check on the
        device where one may run (``ops/matmul/evidence.py``)."""
        assert isinstance(plan, MatmulPlan)
        if plan.selection.pending is None:
            return plan
        return matmul_evidence.first_use(call, backend, plan, lambda c, sel: self.make_plan(c, backend, sel),
                                         self.run_plan)

    def make_hot(self, plan: Plan, call: MatmulCall, canon: tuple[Any, ...]) -> Any:
        assert isinstance(plan, MatmulPlan)
        if call.residual is not None:  # no hot entry yet: every call with a residual takes the full path
            return None
        return matmul_hot.make_hot(plan, call, canon)

    def compile_cases(self, target: Any) -> Any:
        from xkernels.ops.matmul.compile import mm_cases

        return mm_cases(self, target)

    def compile_classes(self) -> list[dict[str, Any]]:
        """The classes of this op's calls as table conditions (dtype, activation, bias): the compile
        check walks the tuning rules once per class."""
        raise NotImplementedError

    def run_plan(self, plan: Plan, call: MatmulCall) -> torch.Tensor:
        assert isinstance(plan, MatmulPlan)
        if plan.vendor:
            if call.residual is not None:
                return matmul_residual.run_vendor(call, plan.epilogue)
            if not plan.epilogue:
                return self.torch_impl(call)
            result = epilogue_linear(call.a, call.b, call.bias, plan.epilogue).view(call.out_shape)
            return result if call.out is None else call.out.copy_(result)
        M, N = call.a.shape[-2], call.b.shape[-1]
        full = tuple(call.batch) + (M, N)
        direct = call.out is not None and call.out.is_contiguous()
        c = call.out.view(full) if direct else torch.empty(full, dtype=call.result_dtype, device=call.device)
        if c.numel():
            plan.launch(call.a, call.b, c, call.bias, call.slope, tuple(call.batch), call.residual)
        result = c.view(call.out_shape)
        if call.out is None or direct:
            return call.out if direct else result
        call.out.copy_(result)
        return call.out


class Matmul(_MatmulBase):
    """``torch.matmul``: 1-D, 2-D and batched with broadcast batch dims; K = 0 gives zeros.

    float16, bfloat16 and float32 run the Triton kernel; float64 and complex are computed by
    PyTorch; integer and bool dtypes are a TypeError (as on CUDA in PyTorch).
    """

    def compile_classes(self) -> list[dict[str, Any]]:
        from xkernels.ops.matmul.compile import MM_DTYPES

        return [{"dtype": d, "activation": "none", "bias": False} for d in MM_DTYPES]

    def compile_layouts(self, cfg: dict[str, Any], shape_when: dict[str, Any], cls: dict[str, Any],
                        dtype: torch.dtype) -> Any:
        from xkernels.ops.matmul.compile import matmul_layouts

        return matmul_layouts(cfg, shape_when, cls, dtype)

    name = "matmul"
    autocast_params = ("a", "b")  # cast under torch.autocast, as PyTorch casts its GEMMs (ops/autocast.py)
    params = (Param("a"), Param("b"), Param("out", None, positional=False))

    def check(self, a: Any, b: Any, *, out: torch.Tensor | None = None) -> MatmulCall:
        _check_pair("matmul", a, b, ("a", "b"))
        device = checks.common_device("matmul", {"a": a, "b": b})
        if a.device != b.device:
            raise ValueError(f"xkernels.ops.matmul: tensors must be on one device, got 'a' on {a.device}, "
                             f"'b' on {b.device}")
        a2 = a.unsqueeze(0) if a.dim() == 1 else a
        b2 = b.unsqueeze(-1) if b.dim() == 1 else b
        if a2.shape[-1] != b2.shape[-2]:
            raise ValueError(f"xkernels.ops.matmul: inner dimensions differ: 'a' {tuple(a.shape)} @ "
                             f"'b' {tuple(b.shape)} (K {a2.shape[-1]} vs {b2.shape[-2]})")
        batch = checks.broadcast_shape("matmul", {"a batch": a2.shape[:-2], "b batch": b2.shape[:-2]})
        M, N = a2.shape[-2], b2.shape[-1]
        # fold the batch of a into M when b has none and a's batch + M dims are one stride run
        if b.dim() <= 2 and a2.dim() > 2 and _foldable(a2):
            a2 = a2.reshape(math.prod(a2.shape[:-1]), a2.shape[-1])  # not -1: K may be 0
            batch = torch.Size()
        shape = list(checks.broadcast_shape("matmul", {"a batch": a.shape[:-2] if a.dim() > 1 else (),
                                                       "b batch": b.shape[:-2] if b.dim() > 1 else ()}))
        if a.dim() > 1:
            shape.append(M)
        if b.dim() > 1:
            shape.append(N)
        out_shape = torch.Size(shape)
        checks.check_out("matmul", out, out_shape, a.dtype, device, {"a": a, "b": b})
        reason = _kernel_reason(a.dtype)
        return MatmulCall(a2, b2, None, None, 0.0, out, batch, out_shape, a.dtype, device, not reason, reason)

    def autograd(self, canon: tuple[Any, ...], route: Route | None = None) -> torch.Tensor:
        a, b, out = canon
        reject_out(self.name, out)
        return MatmulFunction.apply(self.forward_of(route, canon, (0, 1), self.call_no_grad), matmul, a, b)

    def library_call(self, canon: tuple[Any, ...]) -> torch.Tensor:
        return torch.ops.xkernels.matmul.default(canon[0], canon[1])

    def torch_impl(self, call: MatmulCall) -> torch.Tensor:
        result = torch.matmul(call.a, call.b).reshape(call.out_shape)
        if call.out is None:
            return result
        call.out.copy_(result)
        return call.out


def _foldable(a: torch.Tensor) -> bool:
    """Whether a's batch dims and M form one stride run, so (B..., M, K) views as (B*M, K)."""
    sizes, strides = list(a.shape[:-1]), list(a.stride()[:-1])
    for i in range(len(sizes) - 1):
        if sizes[i] != 1 and strides[i] != strides[i + 1] * sizes[i + 1]:
            return False
    return True


class Linear(_MatmulBase):
    """``F.linear(x, weight, bias)`` followed by ``activation`` (relu, gelu, gelu_tanh, silu, leaky_relu,
    quick_gelu, relu2), with bias and activation fused into the matmul epilogue. ``negative_slope`` is leaky_relu's.
    ``residual`` (broadcastable to the result, never growing it) is added after the activation,
    in the epilogue too; the result dtype is torch's promotion of the sum (``matmul/residual.py``)."""

    def compile_classes(self) -> list[dict[str, Any]]:
        """Each dtype x activation (``ACTIVATIONS``: a new epilogue is compiled with no edit
        elsewhere) x with and without bias; and the residual epilogue, for each dtype x bias,
        without activation (a transformer's o_proj / down_proj / c_proj) and after gelu."""
        from xkernels.ops.matmul.compile import MM_DTYPES

        return ([{"dtype": d, "activation": a or "none", "bias": b}
                 for d in MM_DTYPES for a in ACTIVATIONS for b in (True, False)]
                + [{"dtype": d, "activation": a, "bias": b, "residual": True}
                   for d in MM_DTYPES for a in ("none", "gelu") for b in (True, False)])

    def compile_layouts(self, cfg: dict[str, Any], shape_when: dict[str, Any], cls: dict[str, Any],
                        dtype: torch.dtype) -> Any:
        from xkernels.ops.matmul.compile import linear_layouts

        return linear_layouts(cfg, shape_when, cls, dtype)

    name = "linear"
    autocast_params = ("x", "weight", "bias")  # cast under torch.autocast, as PyTorch casts its GEMMs (ops/autocast.py)
    params = (Param("x"), Param("weight"), Param("bias", None), Param("activation", None, key="value"),
              Param("negative_slope", 0.01, positional=False, key="type"),
              Param("residual", None, positional=False), Param("out", None, positional=False))

    def check(self, x: Any, weight: Any, bias: Any = None, activation: str | None = None, *,
              negative_slope: float = 0.01, residual: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> MatmulCall:
        _check_pair("linear", x, weight, ("x", "weight"))
        if weight.dim() != 2:
            raise ValueError(f"xkernels.ops.linear: 'weight' must be 2-D (out_features, in_features), "
                             f"got shape {tuple(weight.shape)}")
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(f"xkernels.ops.linear: 'x' {tuple(x.shape)} has {x.shape[-1]} features, "
                             f"'weight' {tuple(weight.shape)} expects {weight.shape[1]}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"xkernels.ops.linear: 'activation' must be one of "
                             f"{[k for k in ACTIVATIONS if k]} or None, got {activation!r}")
        named = {"x": x, "weight": weight}
        if bias is not None:
            checks.require_tensor("linear", "bias", bias)
            if tuple(bias.shape) != (weight.shape[0],):
                raise ValueError(f"xkernels.ops.linear: 'bias' must have shape ({weight.shape[0]},), "
                                 f"got {tuple(bias.shape)}")
            if bias.dtype != x.dtype:
                raise TypeError(f"xkernels.ops.linear: 'bias' dtype {bias.dtype} differs from 'x' dtype {x.dtype}")
            named["bias"] = bias
        out_shape = torch.Size((*x.shape[:-1], weight.shape[0]))
        dtype = x.dtype
        if residual is not None:
            dtype = matmul_residual.check(residual, out_shape, x.dtype, out)
            named["residual"] = residual
        device = checks.common_device("linear", named)
        if any(t.device != device for t in named.values()):
            listing = ", ".join(f"'{n}' on {t.device}" for n, t in named.items())
            raise ValueError(f"xkernels.ops.linear: tensors must be on one device, got {listing}")
        checks.check_out("linear", out, out_shape, dtype, device, named)
        if residual is not None:
            matmul_residual.reject_operand_out(out, named)
        a = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]) if x.dim() != 2 else x  # not -1: K may be 0
        reason = _kernel_reason(x.dtype) or ("" if dtype in checks.MATMUL_KERNEL_DTYPES else
                                             f"the residual promotes the result to {dtype}, which has no Triton "
                                             "matmul kernel; PyTorch computes it")
        return MatmulCall(a, weight.t(), bias, activation, float(negative_slope), out, torch.Size(),
                          out_shape, x.dtype, device, not reason, reason, residual, dtype)

    def autograd(self, canon: tuple[Any, ...], route: Route | None = None) -> torch.Tensor:
        """Where a gradient is required: relu, leaky_relu with a slope >= 0 and relu2 stay fused
        (their derivative is read off the output); gelu, gelu_tanh, silu, quick_gelu and a negative slope run as one
        kernel writing the output and the pre-activation where that pays
        (``matmul/pre_activation.py``), else as ``linear`` without activation followed by
        PyTorch's activation, so the backward reads
        the pre-activation autograd keeps, as PyTorch's own does, instead of recomputing it
        with one more GEMM (on an H100 at BERT's FFN shape the recompute cost 73 us, the
        separate activation 39 us)."""
        x, weight, bias, activation, slope, residual, out = canon
        reject_out(self.name, out)
        if residual is not None:
            return self._autograd_residual(x, weight, bias, activation, slope, residual)
        if activation not in ACTIVATIONS:  # before autograd keeps it for the backward
            self.check(x, weight, bias, activation)
        if self.splits(activation, slope):
            fused = matmul_pre.recorded(self, matmul, x, weight, bias, activation, slope)
            if fused is not None:  # one kernel writes the output and the pre-activation the backward reads
                return fused
            # in the form its own autograd forward calls it (one signature key, so it finds that route)
            return activate(self(x, weight, bias, None, negative_slope=0.01), activation, slope)
        run = lambda x, w, b: self.call_no_grad(x, w, b, activation, negative_slope=slope)  # noqa: E731
        run = self.forward_of(route, canon, (0, 1, 2), run)  # route: of this very call (activation kept)
        return LinearFunction.apply(run, matmul, linear, x, weight, bias, activation, slope)

    def explain(self, *args: Any, **kwargs: Any) -> Explanation:
        """``Op.explain``, plus how the call runs where a gradient is required when that differs
        (an activation whose backward reads the pre-activation: ``matmul/pre_activation.py``)."""
        exp = super().explain(*args, **kwargs)
        call = self.check(*args, **kwargs)
        if call.residual is not None or not self.splits(call.activation, call.slope):
            return exp
        backend, plan = self._decide(call, explaining=True)
        return dataclasses.replace(exp, training=matmul_pre.describe(args[0] if args else kwargs["x"], call, backend,
                                                                       plan))

    @staticmethod
    def splits(activation: Any, slope: Any) -> bool:
        """Whether a call requiring a gradient runs as ``linear`` without activation followed by
        PyTorch's ``activation`` (``autograd``): gelu, gelu_tanh, silu, quick_gelu, leaky_relu with a negative
        slope. False for an activation ``linear`` does not know (the call then raises)."""
        return (activation in ACTIVATIONS and activation is not None and activation not in ("relu", "relu2")
                and not (activation == "leaky_relu" and slope >= 0))

    def _autograd_residual(self, x: Any, weight: Any, bias: Any, activation: str | None, slope: float,
                           residual: Any) -> torch.Tensor:
        """With a residual: no activation stays one fused call (the residual's gradient is the
        output's, summed over its broadcast dims); with one, relu's and relu2's derivatives can no
        longer be read off the output and the others need the pre-activation, so ``linear`` with the
        activation is recorded as without a residual, and PyTorch's add follows."""
        self.check(x, weight, bias, activation, negative_slope=slope, residual=residual)  # before anything runs
        if activation is not None:
            return self(x, weight, bias, activation, negative_slope=slope) + residual
        run = lambda x, w, b, r: self.call_no_grad(x, w, b, residual=r)  # noqa: E731
        return LinearFunction.apply(run, matmul, linear, x, weight, bias, None, slope, residual)

    def library_call(self, canon: tuple[Any, ...]) -> torch.Tensor:
        x, weight, bias, activation, slope, residual, _ = canon
        return torch.ops.xkernels.linear.default(x, weight, bias, activation, float(slope), residual)

    def torch_impl(self, call: MatmulCall) -> torch.Tensor:
        if call.residual is not None:
            result = matmul_residual.torch_linear(call)
            return result if call.out is None else call.out.copy_(result)
        result = reference_linear(call.a, call.b.t(), call.bias, call.activation, call.slope).reshape(call.out_shape)
        if call.out is None:
            return result
        call.out.copy_(result)
        return call.out


matmul = Matmul()
linear = Linear()
