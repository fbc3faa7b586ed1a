"""``linear``'s computations with PyTorch's own ops: the unfused reference it is defined by, the
vendor BLAS with its fused epilogue (``torch._addmm_activation``), and the shared zero bias."""

from __future__ import annotations

import torch

#: The epilogues ``torch._addmm_activation`` applies (its ``use_gelu`` flag per activation name):
#: those a backend may list in ``vendor_epilogues``.
BLAS_EPILOGUES = {"relu": False, "gelu_tanh": True}


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     activation: str | None, negative_slope: float = 0.01) -> torch.Tensor:
    """The unfused PyTorch composition ``linear`` is defined by (and benchmarked against)."""
    return activate(torch.nn.functional.linear(x, weight, bias), activation, negative_slope)


def epilogue_linear(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    """``activation(a @ b + bias)`` (2-D ``a``, ``b`` the weight transposed) with bias and
    activation applied by the device's BLAS in its epilogue (``Backend.vendor_epilogues``); a
    missing bias is a zero one (``zero_bias``). No derivative is defined for it: calls that need
    a gradient take ``reference_linear``."""
    if bias is None:
        bias = zero_bias(b.shape[1], a.dtype, a.device)
    return torch._addmm_activation(bias, a, b, use_gelu=BLAS_EPILOGUES[activation])


_ZEROS: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}
_ZEROS_LIMIT = 64  # distinct (width, dtype, device): a model has a handful; cleared beyond this


def zero_bias(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero vector of ``n`` elements, kept per (n, dtype, device) (at most ``_ZEROS_LIMIT`` at a
    time) and never written. One asked
    for while a CUDA graph is being captured is made for that call only: its zeros are written
    by the graph, so outside it they would be garbage."""
    key = (n, dtype, device)
    zeros = _ZEROS.get(key)
    if zeros is None:
        zeros = torch.zeros(n, dtype=dtype, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            if len(_ZEROS) >= _ZEROS_LIMIT:
                _ZEROS.clear()
            _ZEROS[key] = zeros
    return zeros


def activate(y: torch.Tensor, activation: str | None, negative_slope: float = 0.01) -> torch.Tensor:
    """PyTorch's ``activation`` of ``y`` (``None``: ``y`` itself)."""
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu":
        return torch.nn.functional.gelu(y)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(y, approximate="tanh")
    if activation == "silu":
        return torch.nn.functional.silu(y)
    if activation == "leaky_relu":
        return torch.nn.functional.leaky_relu(y, negative_slope)
    if activation == "quick_gelu":  # as transformers' QuickGELUActivation
        return y * torch.sigmoid(1.702 * y)
    if activation == "relu2":  # as transformers' ReLUSquaredActivation
        return torch.square(torch.relu(y))
    return y
