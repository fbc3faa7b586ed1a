"""Gradients of the ops, shared by eager autograd and the registered custom ops (``library.py``).

Eager calls that need a gradient (grad mode on, a tensor argument with ``requires_grad``) run
through the ``torch.autograd.Function`` subclasses here: the forward is the op's
``call_no_grad`` (hot entries, any backend); the backward is the op's derivative:

* ``broadcast`` / ``add``: the incoming gradient (times ``alpha`` for ``y``) summed over the
  dims the operand was broadcast along (``Tensor.sum_to_size``), cast to the operand's dtype;
* ``matmul``: ``grad @ b^H`` and ``a^H @ grad`` through ``xkernels.ops.matmul`` (so they use the
  tuned kernels), 1-D operands promoted and broadcast batch dims summed;
* ``linear``: the activation's derivative (aten's own backward kernels: ``threshold_backward``,
  ``gelu_backward``, ``silu_backward``, ``leaky_relu_backward``; quick_gelu's and relu2's as
  autograd steps through ``z * sigmoid(1.702 z)`` and ``square(relu(z))``), then the two GEMMs through
  ``xkernels.ops.matmul`` and the bias gradient as a sum over rows. relu, leaky_relu with a
  slope >= 0 and relu2 read their derivative off the output (relu2's ``2 relu(z)`` is ``2 sqrt(y)``;
  a double backward recomputes z, so its second derivative is PyTorch's). gelu, gelu_tanh, silu,
  quick_gelu and a negative slope need the pre-activation: eagerly, one kernel stores it next to the output where that pays
  (``ops/matmul/pre_activation.py``), else ``Linear.autograd`` runs them as ``linear`` +
  PyTorch's activation, so autograd keeps it; the registered custom op (``library.py``, one fused node
  under ``torch.compile``) recomputes it in the backward with ``xkernels.ops.linear``. A
  ``residual`` gets the output's gradient summed over its broadcast dims, in its dtype; the rest
  take the output's gradient cast to x's dtype (a residual may promote the result).

Calls whose plan is the vendor BLAS do not come here: their hot entry runs torch's ops, which
autograd records itself (``Op.__call__``).

Reductions, the ``alpha`` scaling and the activation derivatives run in PyTorch. ``out=`` has no
gradient (as in PyTorch): a call with ``out=`` where a gradient is required raises before
anything runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
MatmulFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LinearFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def needs_grad(values: tuple[Any, ...]) -> bool:
    """Whether any tensor among ``values`` requires grad (grad mode is checked by the caller)."""
    for v in values:
        if isinstance(v, torch.Tensor) and v.requires_grad:
            return True
    return False


def input_needs(ctx: Any, n: int) -> tuple[bool, ...]:
    """``ctx.needs_input_grad`` of a custom op's backward, padded with ``False`` to ``n`` entries:
    a compiled graph calls the op without the arguments left at their defaults (FX leaves them
    out), and an absent argument needs no gradient."""
    needs = tuple(ctx.needs_input_grad)
    return needs + (False,) * (n - len(needs)) if len(needs) < n else needs


def reject_out(op: str, out: Any) -> None:
    if out is not None:
        raise ValueError(f"xkernels.ops.{op}: 'out=' does not support autograd, and an argument requires grad; "
                         f"call without 'out=' or under torch.no_grad()")


# -- formulas (mm / lin: the GEMMs to use, eager ops or registered custom ops) ------------------
def _to_operand(grad: torch.Tensor, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``grad`` summed over the broadcast dims of an operand of ``shape``, in its dtype and device."""
    g = grad.sum_to_size(shape) if grad.shape != shape else grad
    if g.is_complex() and not dtype.is_complex:
        g = g.real
    if g.dtype != dtype:
        g = g.to(dtype)
    return g if g.device == device else g.to(device)


def _is_number(v: Any) -> bool:
    return isinstance(v, (bool, int, float, complex))


def binary_backward(grad: torch.Tensor, x: Any, y: Any, alpha: Any,
                    needs: tuple[bool, bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``x + alpha * y`` for the operands that need one (tensors, or anything with
    their ``shape``, ``dtype`` and ``device``; Python numbers get none)."""
    gx = gy = None
    if needs[0] and not _is_number(x):
        gx = _to_operand(grad, x.shape, x.dtype, x.device)
    if needs[1] and not _is_number(y):
        scaled = grad if alpha == 1 else grad * (alpha.conjugate() if isinstance(alpha, complex) else alpha)
        gy = _to_operand(scaled, y.shape, y.dtype, y.device)
    return gx, gy


def matmul_backward(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, needs: tuple[bool, bool],
                    mm: MatmulFn) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``torch.matmul(a, b)`` (1-D operands, broadcast batch dims)."""
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    g = grad.unsqueeze(-1) if b.dim() == 1 else grad  # back to (..., M, N)
    g = g.unsqueeze(-2) if a.dim() == 1 else g
    ga = gb = None
    if needs[0]:
        ga = mm(g, b2.mT.conj()).sum_to_size(a2.shape).reshape(a.shape)
    if needs[1]:
        if b2.dim() == 2 and g.dim() > 2:  # b shared by the whole batch: one GEMM over batch * M rows
            a_rows = a2.expand(*g.shape[:-2], *a2.shape[-2:]).reshape(-1, a2.shape[-1])
            gb = mm(a_rows.mT.conj(), g.reshape(-1, g.shape[-1])).reshape(b.shape)
        else:
            gb = mm(a2.mT.conj(), g).sum_to_size(b2.shape).reshape(b.shape)
    return ga, gb


def activation_grad(grad: torch.Tensor, activation: str | None, slope: float, y: torch.Tensor,
                    pre: Callable[[], torch.Tensor]) -> torch.Tensor:
    """d loss / d pre-activation, from the output ``y`` where that determines it, else from
    ``pre()`` (the recomputed pre-activation)."""
    if activation is None:
        return grad
    if activation == "relu" and y is not None:
        return aten.threshold_backward(grad, y, 0)
    if activation == "leaky_relu" and slope >= 0 and y is not None:  # y > 0 exactly where the pre-activation is
        return aten.leaky_relu_backward(grad, y, slope, True)
    if activation == "relu2" and y is not None and not torch.is_grad_enabled():
        # y = relu(z)**2, so 2 relu(z) = 2 sqrt(y) (0 where y is; an fp16 y that underflowed, |z| < 2.4e-4,
        # gives 0 for PyTorch's 2z). A double backward recomputes z below: d sqrt(y) has no finite
        # derivative where y = 0.
        return y.sqrt().mul_(grad).mul_(2.0)
    z = pre()  # (relu without y: a residual was added to the output; relu2 in a double backward)
    if activation == "relu":
        return aten.threshold_backward(grad, z, 0)
    if activation == "leaky_relu":
        return aten.leaky_relu_backward(grad, z, slope, False)
    if activation == "gelu":
        return aten.gelu_backward(grad, z, approximate="none")
    if activation == "gelu_tanh":
        return aten.gelu_backward(grad, z, approximate="tanh")
    if activation == "silu":
        return aten.silu_backward(grad, z)
    if activation == "quick_gelu":  # autograd's steps through z * sigmoid(1.702 z), so its very bits
        s = torch.sigmoid(1.702 * z)
        return grad * s + aten.sigmoid_backward(grad * z, s) * 1.702
    if activation == "relu2":  # autograd's steps through square(relu(z)): pow's backward, then relu's
        r = torch.relu(z)
        return aten.threshold_backward(grad * (2.0 * r), r, 0)
    raise ValueError(f"xkernels.ops.linear: no derivative for activation {activation!r}")


def linear_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    activation: str | None, slope: float, y: torch.Tensor | None, needs: tuple[bool, bool, bool],
                    mm: MatmulFn, lin: LinearFn) -> tuple[torch.Tensor | None, ...]:
    """Gradients of ``act(x @ weight.T + bias)`` for x, weight and bias (``y``: the output where
    the activation's derivative is read off it, else ``None``)."""
    if grad.dtype != x.dtype and not grad.is_complex():  # a residual promoted the sum: as autograd casts it
        grad = grad.to(x.dtype)
    gz = activation_grad(grad, activation, slope, y, lambda: lin(x, weight, bias))
    n, k = weight.shape
    g2 = gz.reshape(-1, n)
    gx = mm(g2, weight.conj()).reshape(x.shape) if needs[0] else None
    gw = mm(g2.mT, x.reshape(-1, k).conj()) if needs[1] else None
    gb = g2.sum(0) if needs[2] and bias is not None else None
    return gx, gw, gb


# -- eager autograd -----------------------------------------------------------------------------
def owned(result: torch.Tensor, *inputs: Any) -> torch.Tensor:
    """A Function's output as a tensor of its own. Kernels write a buffer made in the forward and
    the result is often a view of it (a 2-D GEMM output viewed at the input's batch dims); autograd
    marks a view a custom Function returns as one that may not be changed in place, where
    PyTorch's own op's output may (``out = shared_expert(x); out.add_(routed)``: Llama 4's MoE).
    Such a result is returned detached from its buffer, the same memory, layout and version
    counter (a change in place still fails a backward that reads it, as PyTorch's does). A view
    of an input stays a view."""
    if not result._is_view():
        return result
    base = result._base
    for v in inputs:
        if isinstance(v, torch.Tensor) and (base is v or base is v._base):
            return result
    return result.detach()


class BinaryFunction(torch.autograd.Function):
    """``run(x, y)`` = x + alpha * y, with its gradient."""

    @staticmethod
    def forward(ctx: Any, run: Callable[[Any, Any], torch.Tensor], x: Any, y: Any, alpha: Any) -> torch.Tensor:
        ctx.operands = tuple(_Operand(v) if isinstance(v, torch.Tensor) else v for v in (x, y))
        ctx.alpha = alpha
        return owned(run(x, y), x, y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, y = ctx.operands
        gx, gy = binary_backward(grad, x, y, ctx.alpha, (ctx.needs_input_grad[1], ctx.needs_input_grad[2]))
        return None, gx, gy, None


class _Operand:
    """Shape, dtype and device of an operand (its data is not needed for the gradient)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device


class MatmulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run: Callable[[Any, Any], torch.Tensor], mm: MatmulFn, a: torch.Tensor,
                b: torch.Tensor) -> torch.Tensor:
        """``run(a, b)``; ``mm`` (``xkernels.ops.matmul``, so that a double backward is recorded
        too) computes the backward GEMMs."""
        ctx.save_for_backward(a, b)
        ctx.mm = mm
        return owned(run(a, b), a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        a, b = ctx.saved_tensors
        ga, gb = matmul_backward(grad, a, b, (ctx.needs_input_grad[2], ctx.needs_input_grad[3]), ctx.mm)
        return None, None, ga, gb


def keeps_output(activation: str | None, slope: float, residual: Any) -> bool:
    """Whether the activation's derivative is read off the output (relu, leaky_relu with a slope
    >= 0, relu2), which a residual added to it rules out."""
    return residual is None and (activation in ("relu", "relu2") or activation == "leaky_relu" and slope >= 0)


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run: Callable[..., torch.Tensor], mm: MatmulFn, lin: LinearFn, x: torch.Tensor,
                weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None, slope: float,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """``run(x, weight, bias)`` (``run(x, weight, bias, residual)`` with a residual); ``mm``
        and ``lin`` (``xkernels.ops.matmul`` / ``linear``) compute the backward GEMMs and a
        recomputed pre-activation."""
        y = run(x, weight, bias) if residual is None else run(x, weight, bias, residual)
        ctx.mm, ctx.lin = mm, lin
        # the output is kept only where the derivative is read off it (see activation_grad); a
        # run that returns (output, pre-activation) (ops/matmul/pre_activation.py) keeps the latter
        ctx.stored_pre = isinstance(y, tuple)
        y, pre = y if ctx.stored_pre else (y, None)
        y = owned(y, x, weight, bias, residual)
        if ctx.stored_pre:
            ctx.save_for_backward(x, weight, bias, pre)
        else:
            ctx.save_for_backward(x, weight, bias, y if keeps_output(activation, slope, residual) else None)
        ctx.activation, ctx.slope = activation, float(slope)
        ctx.residual = None if residual is None else _Operand(residual)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight, bias, y = ctx.saved_tensors
        needs = ctx.needs_input_grad
        lin = ctx.lin
        if ctx.stored_pre:
            pre, y = y, None
            if not torch.is_grad_enabled():  # a double backward recomputes it: the stored one has no history
                lin = lambda *_: pre  # noqa: E731
        gx, gw, gb = linear_backward(grad, x, weight, bias, ctx.activation, ctx.slope, y,
                                     (needs[3], needs[4], needs[5]), ctx.mm, lin)
        r = ctx.residual
        gr = _to_operand(grad, r.shape, r.dtype, r.device) if r is not None and needs[8] else None
        return None, None, None, gx, gw, gb, None, None, gr
