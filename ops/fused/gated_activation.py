"""``act(gate) * up`` of an already computed gate_up result, in one Triton pass each way: the part
of ``gated_linear``'s vendor route after the BLAS, for callers whose GEMMs are not ``F.linear``.

The caller is a mixture-of-experts layer: transformers' ``@use_experts_implementation`` experts
(Mixtral, Qwen2/3-MoE, DeepSeek-V3, OLMoE and the other classes with the default flags) compute
every routed token's gate_up projection in one grouped GEMM (``grouped_mm``, transformers' default)
or batched GEMM (``batched_mm``), then call ``self._apply_gate(gate_up)``: ``gate, up =
gate_up.chunk(2, -1)`` and ``act_fn(gate) * up``, which writes ``act(gate)`` and reads it back
(PyTorch's backward reads gate and up five times and writes three intermediates).
``xkernels.patch`` gives those modules :func:`gated_activation` (``xkernels/blocks.py``).

* Forward: ``gate_kernel`` (``gated_linear_kernels.py``) reads both halves once, computes in fp32
  and writes ``act(gate) * up`` once; the halves are strided views, nothing is copied.
* Backward: ``gate_grad_kernel`` (``gated_linear_plan.gate_grads``) writes ``d(gate_up)``, the
  halves of one buffer, from dy and the kept gate_up in one pass. A backward that builds a graph
  (``create_graph``) differentiates PyTorch's composition instead, so second derivatives are
  PyTorch's.

:func:`clamped_gated_activation` is the same pass for GPT-OSS's gate (``_apply_gate`` of GPT-OSS,
its privacy filter, MiniMax-M3-VL; DeepSeek-V4's, GLM-5-Next's and HY-V4's with alpha 1 and no
shift): ``c = min(gate, limit)``, ``v = clamp(up, -limit, limit)``, ``(v + shift) * c *
sigmoid(alpha * c)``, the halves either chunked or interleaved (GPT-OSS's ``gate_up[..., ::2]``,
``gate_up[..., 1::2]``); its gradient is zero where a clamp bounds, as ``torch.clamp``'s.

Both return ``None`` where the pass does not apply, and the caller runs its own code: a backend
that runs no kernels (the cpu backend), while ``torch.compile`` traces (the class's own code is
traced: Inductor fuses it), a dtype other than fp16 / bf16 / fp32, an activation
``gated_linear`` does not take, an odd or empty last dimension.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from xkernels import dispatch
from xkernels.ops.autograd import owned
from xkernels.ops.fused import gated_linear_plan
from xkernels.ops.fused.gated_linear import ACTIVATIONS
from xkernels.ops.fused.gated_linear_plan import ClampedGlu, GatePlan
from xkernels.ops.matmul.vendor import activate

__all__ = ["clamped_gated_activation", "gated_activation"]

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _halves(g2: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    n = g2.shape[-1] // 2
    return (g2[:, 0::2], g2[:, 1::2]) if interleaved else (g2[:, :n], g2[:, n:])


def _forward(backend: Any, gate: torch.Tensor, up: torch.Tensor, activation: str | None,
             glu: ClampedGlu | None) -> torch.Tensor:
    M, N = gate.shape
    y = gated_linear_plan._empty((M, N), gate.dtype, gate.device)
    if M and N:
        strides = (*gate.stride(), *up.stride(), *y.stride())
        key = (backend.name, gate.device, gate.dtype, M, N, activation, glu, strides)
        plan = gated_linear_plan.gate_plans.get(key, lambda: GatePlan(backend, gate.device, M, N, activation, strides,
                                                                      glu))
        plan.launcher(gate, up, y, *plan.tail)
    return y


def _composed(gate_up: torch.Tensor, activation: str | None, glu: ClampedGlu | None,
              interleaved: bool) -> torch.Tensor:
    """PyTorch's composition of the pass (the classes' own code): for a graph-building backward."""
    gate, up = _halves(gate_up, interleaved)
    if glu is None:
        return activate(gate, activation) * up
    c = gate.clamp(max=glu.limit)
    return (up.clamp(min=-glu.limit, max=glu.limit) + glu.shift) * (c * torch.sigmoid(c * glu.alpha))


class GatedActivationFunction(torch.autograd.Function):
    """The pass where gate_up requires a gradient: gate_up is kept (PyTorch's composition keeps
    gate, up and act(gate)); the backward is one ``gate_grad_kernel`` launch."""

    @staticmethod
    def forward(ctx: Any, gate_up: torch.Tensor, activation: str | None, glu: ClampedGlu | None, interleaved: bool,
                backend: Any) -> torch.Tensor:
        ctx.save_for_backward(gate_up)
        ctx.activation, ctx.glu, ctx.interleaved, ctx.backend = activation, glu, interleaved, backend
        return owned(_forward(backend, *_halves(gate_up, interleaved), activation, glu), gate_up)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        (gate_up,) = ctx.saved_tensors
        build = torch.is_grad_enabled()  # create_graph
        if not build:
            grads = gated_linear_plan.gate_grads(ctx.backend, dy, *_halves(gate_up, ctx.interleaved), ctx.activation,
                                                 True, ctx.glu, ctx.interleaved)
            if grads is not None:
                return grads[2], None, None, None, None
        with torch.enable_grad():  # PyTorch's composition (or a dy the kernel does not take)
            leaf = gate_up if build else gate_up.detach().requires_grad_()
            y = _composed(leaf, ctx.activation, ctx.glu, ctx.interleaved)
            (d,) = torch.autograd.grad(y, leaf, dy, create_graph=build)
        return d, None, None, None, None


def _run(gate_up: Any, activation: str | None, glu: ClampedGlu | None, interleaved: bool) -> torch.Tensor | None:
    if (_is_compiling() or not isinstance(gate_up, torch.Tensor) or gate_up.dtype not in _DTYPES
            or gate_up.dim() == 0 or gate_up.shape[-1] % 2 or not gate_up.numel()):
        return None
    backend = dispatch.select(gate_up.device)
    if not backend.runs_triton:
        return None
    lead = gate_up.shape[:-1]
    g2 = gate_up if gate_up.dim() == 2 else gate_up.reshape(-1, gate_up.shape[-1])
    if torch.is_grad_enabled() and g2.requires_grad:
        y = GatedActivationFunction.apply(g2, activation, glu, interleaved, backend)
    else:
        y = _forward(backend, *_halves(g2, interleaved), activation, glu)
    return y if gate_up.dim() == 2 else y.reshape(*lead, y.shape[-1])


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor | None:
    """``act(gate) * up`` for ``gate, up = gate_up.chunk(2, dim=-1)``, shape ``(*lead, N)``
    from ``(*lead, 2N)``, with autograd; ``None`` where the pass does not apply (module doc)."""
    return _run(gate_up, activation, None, False) if activation in ACTIVATIONS else None


def clamped_gated_activation(gate_up: torch.Tensor, *, alpha: float, limit: float, shift: float,
                             interleaved: bool) -> torch.Tensor | None:
    """GPT-OSS's gate, ``(clamp(up, -limit, limit) + shift) * c * sigmoid(alpha * c)`` with ``c =
    min(gate, limit)``, of ``gate_up`` (``(*lead, 2N)``: halves, or ``interleaved`` even / odd
    columns) as ``(*lead, N)``, with autograd; ``None`` where the pass does not apply (module
    doc; also a non-finite or negative ``limit``, or a non-number ``alpha`` / ``shift``)."""
    numbers = (alpha, limit, shift)
    if (not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers)
            or not all(math.isfinite(v) for v in numbers) or limit < 0):
        return None
    return _run(gate_up, None, ClampedGlu(float(alpha), float(limit), float(shift)), bool(interleaved))
