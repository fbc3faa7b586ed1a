"""PyTorch's version of each op, as the harnesses see it: :data:`OPS` maps an op name to its
:class:`OpSpec` (argument names, how shapes are written, whether it is matmul-like).

``OPS[op].torch_fn`` is the same work done by PyTorch: the reference (run in float64), the
expected result shape and dtype (run on the meta device, :func:`xkernels.harness.case.expected_result`),
and the benchmark baseline. ``OPS[op].reference``, where given, is the float64 reference with the
magnitude the result's rounding scales with (the fused add + norms, rotary_embedding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

OP_NAMES = ("broadcast", "add", "matmul", "linear", "gated_linear", "add_layer_norm", "add_rms_norm",
            "rotary_embedding")
#: ops whose result is ``(y, s)``: a norm of the residual sum and the sum (``return_sum=True``)
NORM_OPS = ("add_layer_norm", "add_rms_norm")


# -- PyTorch's version of each op ---------------------------------------------------------------
def _torch_broadcast(x: torch.Tensor, bias: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    return torch.add(x, bias, out=out)


def _torch_add(x: Any, y: Any, *, alpha: Any = 1, out: torch.Tensor | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor):
        # two Python numbers: torch.add's result, a 0-d CPU tensor of their promoted dtype
        x = torch.tensor(x, dtype=torch.result_type(x, y))
    elif not isinstance(x, torch.Tensor):  # torch.add wants a tensor first; a 0-d one keeps promotion
        x = torch.tensor(x, dtype=torch.float64 if isinstance(x, float) else torch.int64, device=y.device)
    return torch.add(x, y, alpha=alpha, out=out) if alpha != 1 else torch.add(x, y, out=out)


def _torch_matmul(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    return torch.matmul(a, b, out=out)


def _torch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  activation: str | None = None, *, negative_slope: float = 0.01,
                  residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``act(F.linear(x, weight, bias)) + residual``: the activation before the add."""
    from xkernels.ops.matmul.vendor import reference_linear

    result = reference_linear(x, weight, bias, activation, negative_slope)
    if residual is not None:
        result = result + residual
    return result if out is None else out.copy_(result)


def _torch_gated_linear(x: torch.Tensor, weight: torch.Tensor, up_weight: torch.Tensor | None = None,
                        bias: torch.Tensor | None = None, up_bias: torch.Tensor | None = None,
                        activation: str = "silu") -> torch.Tensor:
    """``F.silu(F.linear(x, wg, bg)) * F.linear(x, wu, bu)`` (or the activation given); with a
    concatenated gate_up weight (``up_weight`` None), one ``F.linear`` chunked in two (Phi-3)."""
    from xkernels.ops.fused.gated_linear import reference_gated_linear

    return reference_gated_linear(x, weight, up_weight, bias, up_bias, activation)


def _torch_add_layer_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None = None,
                          bias: torch.Tensor | None = None, eps: float = 1e-5, *, return_sum: bool = True) -> Any:
    s = x if residual is None else x + residual
    y = torch.nn.functional.layer_norm(s, (s.shape[-1],), weight, bias, eps)
    return (y, s) if return_sum else y


def _torch_add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None = None,
                        eps: float = 1e-6, *, offset: float = 0.0, return_sum: bool = True) -> Any:
    """The add, then RMSNorm as Llama's ``LlamaRMSNorm`` computes it (fp32 inside, cast at the end)."""
    s = x if residual is None else x + residual
    h = s if s.dtype == torch.float64 else s.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        h = h * (offset + weight.to(h.dtype))
    y = h.to(s.dtype)
    return (y, s) if return_sum else y


def _norm_reference(kind: str, dtype: torch.dtype, x: torch.Tensor, residual: torch.Tensor | None,
                    weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float, offset: float,
                    return_sum: bool) -> tuple[Any, Any, int]:
    """The float64 reference of a fused add + norm, given the result dtype: ``s`` rounded to it
    first (torch's ``x + residual`` is a tensor of that dtype, and the norm reads that), then the
    norm in float64. With it, per element of y, the magnitude the fp32 statistics' rounding
    scales with, ``(|s - mean| + mean(|s|)) * rstd * |w|`` (RMSNorm: ``|s| * rstd * |offset + w|``),
    and the reduction length N."""
    s = (x if residual is None else x + residual).to(dtype).double()
    if kind == "layer":
        y = _torch_add_layer_norm(s, None, weight, bias, eps, return_sum=False)
        centred = s - s.mean(-1, keepdim=True)
        mag = centred.abs() + s.abs().mean(-1, keepdim=True)
    else:
        y = _torch_add_rms_norm(s, None, weight, eps, offset=offset, return_sum=False)
        centred = mag = s.abs()
    mag = mag * torch.rsqrt(centred.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        mag = mag * (weight + offset).abs()
    n = x.shape[-1]
    return ((y, s.to(dtype)), (mag, None), n) if return_sum else (y, mag, n)


def _ref_add_layer_norm(dtype: torch.dtype, x: torch.Tensor, residual: torch.Tensor | None, weight: Any = None,
                        bias: Any = None, eps: float = 1e-5, *, return_sum: bool = True) -> tuple[Any, Any, int]:
    return _norm_reference("layer", dtype, x, residual, weight, bias, eps, 0.0, return_sum)


def _ref_add_rms_norm(dtype: torch.dtype, x: torch.Tensor, residual: torch.Tensor | None, weight: Any = None,
                      eps: float = 1e-6, *, offset: float = 0.0, return_sum: bool = True) -> tuple[Any, Any, int]:
    return _norm_reference("rms", dtype, x, residual, weight, None, eps, offset, return_sum)


def _torch_rotary_embedding(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                            unsqueeze_dim: int = 1, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb``: ``x * cos + rotate_half(x) * sin`` on the first
    ``cos.shape[-1]`` columns of q and k, the rest passed on (partial rotary); ``interleaved``:
    the adjacent-pair ``rotate_half`` (Cohere's, GLM's)."""
    from xkernels.ops.fused.rotary import torch_rotary

    return torch_rotary(q, k, cos, sin, unsqueeze_dim, interleaved)


def _ref_rotary_embedding(dtype: torch.dtype, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor, unsqueeze_dim: int = 1, interleaved: bool = False) -> tuple[Any, Any, int]:
    """The float64 reference of ``(q_embed, k_embed)`` and, per element, the magnitude an fp32
    product or sum's rounding scales with: ``|x_i cos_i| + |x_j sin_i|`` (``x_j`` the
    ``rotate_half`` partner) on the rotated columns, 0 on the columns passed on; K = 2 terms."""
    refs = _torch_rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved)
    c, s = cos.abs().unsqueeze(unsqueeze_dim), sin.abs().unsqueeze(unsqueeze_dim)
    r = cos.shape[-1]

    def partner(h: torch.Tensor) -> torch.Tensor:
        if interleaved:
            return h.unflatten(-1, (r // 2, 2)).flip(-1).flatten(-2)
        return torch.cat((h[..., r // 2:], h[..., :r // 2]), dim=-1)

    def magnitude(x: torch.Tensor) -> torch.Tensor:
        head = x[..., :r].abs()
        mag = head * c + partner(head) * s
        return torch.cat((mag, torch.zeros_like(x[..., r:])), dim=-1) if r < x.shape[-1] else mag

    return refs, (magnitude(q), magnitude(k)), 2


@dataclass(frozen=True)
class OpSpec:
    """One op as the harnesses see it. ``reference``: where the float64 reference is more than
    ``torch_fn`` on widened inputs: ``reference(result dtype, *args, **kwargs) -> (ref, mag, K)``
    (tuples for ops with several outputs; a ``mag`` of ``None`` for an element-wise output)."""

    name: str
    arg_names: tuple[str, ...]
    torch_fn: Callable[..., Any]
    joiner: str  # how shapes are written in tables: "x + bias", "a @ b"
    matmul_like: bool = False
    gemms: int = 1  # GEMMs of the result's size per call (flop count: 2 * gemms * result numel * K)
    reference: Callable[..., Any] | None = None
    floats_only: bool = False  # checked and timed in float dtypes only (matmul-like ops are too)
    #: the arguments that are leaves requiring grad in a forward+backward row (``None``: every
    #: floating tensor); rotary's cos / sin are tables computed without grad in a model, and
    #: where one requires grad the op runs PyTorch's formula so that autograd records it
    grad_args: tuple[int, ...] | None = None
    magnitude: str = "|A||B|"  # how the tolerance column writes ``mag`` (the matmul's |A| @ |B|)


OPS: dict[str, OpSpec] = {
    "broadcast": OpSpec("broadcast", ("x", "bias"), _torch_broadcast, " + "),
    "add": OpSpec("add", ("x", "y"), _torch_add, " + "),
    "matmul": OpSpec("matmul", ("a", "b"), _torch_matmul, " @ ", matmul_like=True),
    "linear": OpSpec("linear", ("x", "weight", "bias"), _torch_linear, ", ", matmul_like=True),
    "gated_linear": OpSpec("gated_linear", ("x", "weight", "up_weight", "bias", "up_bias"), _torch_gated_linear,
                           ", ", matmul_like=True, gemms=2),
    "add_layer_norm": OpSpec("add_layer_norm", ("x", "residual", "weight", "bias"), _torch_add_layer_norm, ", ",
                             reference=_ref_add_layer_norm, floats_only=True),
    "add_rms_norm": OpSpec("add_rms_norm", ("x", "residual", "weight"), _torch_add_rms_norm, ", ",
                           reference=_ref_add_rms_norm, floats_only=True),
    "rotary_embedding": OpSpec("rotary_embedding", ("q", "k", "cos", "sin"), _torch_rotary_embedding, ", ",
                               reference=_ref_rotary_embedding, floats_only=True, grad_args=(0, 1),
                               magnitude="|x||cs|"),
}
