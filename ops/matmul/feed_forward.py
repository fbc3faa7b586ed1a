"""Training's two-layer MLP, ``down(act(up(x)))``, as one autograd Function whose backward takes
the activation's derivative inside the down-projection's input-gradient GEMM.

Unfused, the backward of BERT's or ViT's feed-forward block writes the down-projection's input
gradient ``dg = dy @ W_down`` (M x F), reads it back with the stored pre-activation ``h`` to form
``dh = dg * act'(h)``, writes ``dh``, and reads ``dh`` once more for the up-projection's bias
gradient. Here one kernel (``kernels.matmul_tma_act_grad_kernel``) computes ``dy @ W_down``, reads
``h`` in its epilogue, writes ``dh`` and the bias gradient's per-tile column sums: the write and
two reads of an (M, F) tensor are saved. The forward is the pre-activation kernel's
(``ops/matmul/pre_activation.py``: one launch writes ``act(h)`` and ``h``) followed by the
down-projection (``xkernels.ops.linear``).

When it runs (:func:`plan_for`; everything else keeps the two layers' own autograd):

* the up-projection's call takes the pre-activation kernel (its gate, the module doc there);
* the down-projection's weight is the up-projection's transposed shape, row-major with
  16-byte rows (TMA), same dtype and device, its bias absent or of the output's length.

The input-gradient GEMM has the up-projection's dimensions (M rows, F outputs, K = D), so it
runs on that call's tiles and grid, B read (K, N) row-major instead of K-major. Gradients are the
unfused form's up to rounding: ``dh`` is rounded once (PyTorch rounds ``dg`` and then ``dh``),
the bias gradient sums the rounded ``dh`` in fp32 in a fixed order. A backward that builds a
graph (``create_graph``) recomputes through the differentiable ops instead, so second
derivatives are those of the unfused form.

Used by ``xkernels.patch`` for the feed-forward blocks it recognises (``xkernels/blocks.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from xkernels.dispatch import _override
from xkernels.launch import Launcher
from xkernels.ops.autograd import linear_backward, owned
from xkernels.ops.matmul import pre_activation

#: constexprs of the up-projection's plan that the input-gradient kernel shares
_SHARED = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "PERSISTENT", "EPILOGUE_SUBTILE", "A_MMAJOR",
           "WARP_SPECIALIZE")


#: registers per SM on NVIDIA GPUs since sm50
_REGISTERS_PER_SM = 65536


def resident_options(plan: Any, backend: Any, device: torch.device) -> dict[str, Any]:
    """The up-projection plan's launch options for the input-gradient kernel, keeping its programs
    per SM resident: H's staging buffer (one C block) and the derivative's registers would
    otherwise leave room for one. Where the plan puts several programs on an SM: one pipeline
    stage fewer, and (NVIDIA) at most 65536 / (programs x threads) registers per thread. BERT's
    FFN shape on an H100 (8192 x 768 -> 3072, bf16, two 8-warp programs per SM): 169.2 us with
    the plan's 3 stages (131 KiB of shared memory, 130 registers), 124.4 us with 2 stages and 128
    registers, against 151.5 us for torch's mm + gelu_backward + sum
    (results/2026-11-27-h100-feed-forward-backward)."""
    options = dict(plan.options)
    per_sm = int(plan.config.get("PROGRAMS_PER_SM") or 1)
    if per_sm <= 1:
        return options
    if "num_stages" in options:
        options["num_stages"] = max(1, int(options["num_stages"]) - 1)
    if backend.inline_ptx(device) and "num_warps" in options:  # ptxas's .maxnreg
        options["maxnreg"] = _REGISTERS_PER_SM // (per_sm * 32 * int(options["num_warps"]))
    return options


class ActGradPlan:
    """The launch of ``matmul_tma_act_grad_kernel`` for one signature: the up-projection's TMA
    plan (tiles, grid, options) with B read (K, N) row-major, its activation code as ``GRAD``."""

    def __init__(self, plan: Any, backend: Any, device: torch.device, slope: float) -> None:
        from xkernels.ops.matmul import kernels as K

        c = plan.constexprs
        self.plan = plan
        self.slope = float(slope)
        self.blocks = (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"])
        self.tiles_m = -(-plan.dims[0] // c["BLOCK_M"])
        constexprs = {k: c[k] for k in _SHARED}
        constexprs.update(B_KMAJOR=False, GRAD=c["ACT"], DBIAS=True)
        self.launcher = Launcher(backend.kernel(K.matmul_tma_act_grad_kernel), plan.grid, constexprs,
                                 resident_options(plan, backend, device), backend.fast_launch)

    def __call__(self, grad: torch.Tensor, weight: torch.Tensor, h: torch.Tensor,
                 into: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dh, dbias)``: ``dh = (grad @ weight) * act'(h)`` (grad (M, D) contiguous, weight the
        (D, F) down-projection weight, h (M, F) contiguous; ``into``: a contiguous (M, F) buffer
        to write) and its column sums in fp32."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bn, bk = self.blocks
        m, d = grad.shape
        f = weight.shape[1]
        dh = torch.empty((m, f), dtype=h.dtype, device=h.device) if into is None else into
        partial = torch.empty((self.tiles_m, f), dtype=torch.float32, device=h.device)
        if (grad.data_ptr() | weight.data_ptr() | h.data_ptr()) & 15:  # TMA needs 16-byte bases
            grad = grad.clone() if grad.data_ptr() & 15 else grad
            weight = weight.clone() if weight.data_ptr() & 15 else weight
            h = h.clone() if h.data_ptr() & 15 else h
        c_block = self.plan.tma["c"]
        self.launcher(TensorDescriptor(grad, [m, d], [d, 1], [bm, bk]),
                      TensorDescriptor(weight, [d, f], [weight.stride(0), 1], [bk, bn]),
                      TensorDescriptor(dh, [m, f], [f, 1], c_block),
                      TensorDescriptor(h, [m, f], [h.stride(0), 1], c_block), partial, m, f, d, self.slope)
        return dh, partial.sum(0)


class FeedForwardPlan:
    """The fused forward (``pre_activation.PreActivationPlan``) and backward (:class:`ActGradPlan`)
    of one call signature."""

    def __init__(self, pre: pre_activation.PreActivationPlan, act_grad: ActGradPlan, activation: str) -> None:
        self.pre, self.act_grad, self.activation = pre, act_grad, activation


_plans = pre_activation.Remembered()


def _signature(t: torch.Tensor | None) -> Any:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def plan_for(linear: Any, x: torch.Tensor, up_weight: torch.Tensor, up_bias: torch.Tensor | None,
             down_weight: torch.Tensor, down_bias: torch.Tensor | None, activation: str,
             slope: float) -> FeedForwardPlan | None:
    """The fused block for this call (``linear``: ``xkernels.ops.linear``), or ``None`` where the
    two layers run as they are (the module doc). Remembered per signature, backend override and
    the op's generation; not under a forced tuning config."""
    key = (linear.generation, _override.get(), _signature(x), _signature(up_weight), _signature(up_bias),
           _signature(down_weight), _signature(down_bias), activation, slope)
    return _plans.get(key, lambda: _make(linear, x, up_weight, up_bias, down_weight, down_bias, activation, slope))


def _make(linear: Any, x: torch.Tensor, up_weight: torch.Tensor, up_bias: torch.Tensor | None,
          down_weight: torch.Tensor, down_bias: torch.Tensor | None, activation: str,
          slope: float) -> FeedForwardPlan | None:
    if up_weight.dim() != 2 or down_weight.dim() != 2 or down_weight.shape != up_weight.shape[::-1]:
        return None
    if down_weight.dtype != x.dtype or down_weight.device != x.device or down_weight.stride(1) != 1:
        return None
    if (down_weight.stride(0) * down_weight.element_size()) % 16:
        return None
    if down_bias is not None and (down_bias.shape != (down_weight.shape[0],) or down_bias.dtype != x.dtype
                                  or down_bias.device != x.device):
        return None
    pre = pre_activation.plan_for(linear, x, up_weight, up_bias, activation, slope)
    if pre is None:
        return None
    backend = linear._decide(linear.check(x, up_weight, up_bias, activation, negative_slope=slope))[0]
    return FeedForwardPlan(pre, ActGradPlan(pre.plan, backend, x.device, slope), activation)


def recorded(linear: Any, mm: Any, x: torch.Tensor, up_weight: torch.Tensor, up_bias: torch.Tensor | None,
             down_weight: torch.Tensor, down_bias: torch.Tensor | None, activation: str,
             slope: float) -> torch.Tensor | None:
    """``linear(act(linear(x, up_weight, up_bias)), down_weight, down_bias)`` recorded by
    autograd as one block, or ``None`` where the fused block does not run (nothing launched)."""
    plan = plan_for(linear, x, up_weight, up_bias, down_weight, down_bias, activation, slope)
    if plan is None:
        return None
    return FeedForwardFunction.apply(plan, linear, mm, x, up_weight, up_bias, down_weight, down_bias, float(slope))


class FeedForwardFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, plan: FeedForwardPlan, linear: Any, mm: Any, x: torch.Tensor, up_weight: torch.Tensor,
                up_bias: torch.Tensor | None, down_weight: torch.Tensor, down_bias: torch.Tensor | None,
                slope: float) -> torch.Tensor:
        g, h = plan.pre(x, up_weight, up_bias)
        y = linear(g, down_weight, down_bias)
        ctx.save_for_backward(x, up_weight, up_bias, down_weight, down_bias, g, h)
        ctx.plan, ctx.linear, ctx.mm, ctx.slope = plan, linear, mm, slope
        return owned(y, x, up_weight, up_bias, down_weight, down_bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, w1, b1, w2, b2, g, h = ctx.saved_tensors
        needs = ctx.needs_input_grad
        lin, mm, act, slope = ctx.linear, ctx.mm, ctx.plan.activation, ctx.slope
        d, f = w2.shape
        if grad.dtype != x.dtype:
            grad = grad.to(x.dtype)
        if torch.is_grad_enabled():  # a double backward: the differentiable unfused form, g recomputed
            g = lin(x, w1, b1, act, negative_slope=slope)
            gg, gw2, gb2 = linear_backward(grad, g, w2, b2, None, slope, None, (True, needs[6], needs[7]), mm, lin)
            gx, gw1, gb1 = linear_backward(gg, x, w1, b1, act, slope, None, (needs[3], needs[4], needs[5]), mm, lin)
            return None, None, None, gx, gw1, gb1, gw2, gb2, None
        dy = grad.reshape(-1, d).contiguous()
        g2, x2 = g.reshape(-1, f), x.reshape(-1, d)
        gw2 = mm(dy.t(), g2) if needs[6] else None
        gb2 = dy.sum(0) if needs[7] and b2 is not None else None
        dh, db1 = ctx.plan.act_grad(dy, w2, h.reshape(-1, f))
        gx = mm(dh, w1).reshape(x.shape) if needs[3] else None
        gw1 = mm(dh.t(), x2) if needs[4] else None
        gb1 = db1.to(b1.dtype) if needs[5] and b1 is not None else None
        return None, None, None, gx, gw1, gb1, gw2, gb2, None


def forget() -> None:
    """Drop the remembered plans (tests; the op's generation already retires stale ones)."""
    _plans.clear()
