"""``act(gate) * up`` of a computed gate_up result (``ops/fused/gated_activation.py``), and GPT-OSS's
clamped gate: forward and gradients against float64 for every activation (clamp) and dtype, into
NaN-poisoned buffers, inputs unchanged; the calls it leaves to the caller."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import Unchanged, rand
from xkernels.ops.fused.gated_activation import clamped_gated_activation, gated_activation
from xkernels.ops.fused.gated_linear import ACTIVATIONS

F = torch.nn.functional
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
#: |err| <= RTOL * |ref| + 1e-5 * (the fp32 math's error on the product's terms) + 1e-6: the kernel computes in
#: fp32 from inputs exact in their dtype and rounds the result once
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-6}


def _act(g: torch.Tensor, activation: str) -> torch.Tensor:
    return {"relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
            "silu": F.silu, "quick_gelu": lambda t: t * torch.sigmoid(1.702 * t),
            "relu2": lambda t: torch.relu(t).square()}[activation](g)


def _ref(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    g, u = gate_up.double().chunk(2, dim=-1)
    return _act(g, activation) * u


def _slope(g: torch.Tensor, activation: str) -> torch.Tensor | float:
    return 2 * g.abs() + 1 if activation == "relu2" else 1.13  # relu2' = 2 relu(g); the others' |f'| <= 1.13


def _bound(gate_up: torch.Tensor, activation: str, dtype: torch.dtype) -> torch.Tensor:
    g, u = gate_up.double().chunk(2, dim=-1)
    return RTOL[dtype] * _ref(gate_up, activation).abs() + 1e-5 * u.abs() * (_slope(g, activation) * g.abs() + 1) + 1e-6


def _kernels(backend) -> None:
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: gated_activation leaves the call to its caller")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_matches_float64(backend, device, nan_memory, dtype):
    _kernels(backend)
    for shape in [(37, 600), (2, 5, 34), (1, 2)]:  # two column tiles of 256 and edge rows; batched; one element
        gu = rand(shape, dtype, device)
        gu[..., :3] = 0  # relu's and relu2's kink
        for activation in ACTIVATIONS:
            with Unchanged(gu):
                y = gated_activation(gu, activation)
            assert y.shape == (*shape[:-1], shape[-1] // 2) and y.dtype == dtype and y.device == gu.device
            err = (y.double().cpu() - _ref(gu.cpu(), activation)).abs()
            assert not torch.isnan(err).any(), "an element not written"
            bound = _bound(gu.cpu(), activation, dtype)
            assert (err <= bound).all(), f"{activation}: worst {(err / bound).max().item():.2f}x the bound"


def test_strided_halves_are_read_in_place(backend, device, nan_memory):
    """A gate_up that is a view (every other row of a bigger result, a transposed buffer) is read
    through its strides: nothing is copied, the result is the dense one's."""
    _kernels(backend)
    big = rand((40, 300), torch.float32, device)
    for gu in (big[::2, :260], big[:, 40:]):  # every other row; an offset
        with Unchanged(big):
            y = gated_activation(gu, "silu")
        torch.testing.assert_close(y.double().cpu(), _ref(gu.cpu(), "silu"), rtol=1e-5, atol=1e-6)
    t = rand((64, 12), torch.float32, device).t()  # (12, 64), column-major
    torch.testing.assert_close(gated_activation(t, "gelu").double().cpu(), _ref(t.cpu(), "gelu"), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_match_float64(backend, device, nan_memory, dtype):
    """d(gate_up) in one buffer, both halves, from the kept gate_up, for every activation."""
    _kernels(backend)
    for activation in ACTIVATIONS:
        gu = rand((2, 9, 70), dtype, device).requires_grad_()
        dy = rand((2, 9, 35), dtype, device)
        y = gated_activation(gu, activation)
        assert y.requires_grad and y.grad_fn is not None
        y.backward(dy)
        g64 = gu.detach().cpu().double().requires_grad_()
        _ref(g64, activation).backward(dy.cpu().double())
        got = gu.grad.double().cpu()
        assert gu.grad.dtype == dtype and not torch.isnan(got).any()
        g, u = gu.detach().cpu().double().chunk(2, dim=-1)
        d = dy.cpu().double().abs()
        terms = torch.cat([d * u.abs() * _slope(g, activation), d * (_act(g, activation).abs() + 1)], -1)
        bound = RTOL[dtype] * g64.grad.abs() + 1e-5 * terms + 1e-6
        err = (got - g64.grad).abs()
        assert (err <= bound).all(), f"{activation}: worst {(err / bound).max().item():.2f}x the bound"


def test_double_backward_is_pytorchs(backend, device):
    """A backward that builds a graph differentiates PyTorch's composition: second derivatives."""
    _kernels(backend)
    gu = rand((4, 10), torch.float32, device).requires_grad_()
    (d,) = torch.autograd.grad(gated_activation(gu, "silu").sum(), gu, create_graph=True)
    (dd,) = torch.autograd.grad(d.sum(), gu)
    g64 = gu.detach().cpu().double().requires_grad_()
    (d64,) = torch.autograd.grad(_ref(g64, "silu").sum(), g64, create_graph=True)
    (dd64,) = torch.autograd.grad(d64.sum(), g64)
    torch.testing.assert_close(d.double().cpu(), d64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dd.double().cpu(), dd64, rtol=1e-5, atol=1e-5)


def test_calls_it_leaves_to_the_caller(backend, device):
    """``None`` (the caller runs its own code) where the pass does not apply; never a result of
    other arguments."""
    x = rand((3, 8), torch.float32, device)
    if not backend.runs_triton:
        assert gated_activation(x, "silu") is None  # the cpu backend: PyTorch's ops either way
        return
    assert gated_activation(rand((3, 7), torch.float32, device), "silu") is None  # odd last dim
    assert gated_activation(x, "softplus") is None
    assert gated_activation(x.double(), "silu") is None
    assert gated_activation(x[:0], "silu") is None
    assert gated_activation(x, "silu") is not None


def test_cpu_backend_leaves_every_call():
    with xkernels.use_backend("cpu"):
        assert gated_activation(torch.randn(3, 8), "silu") is None


# -- GPT-OSS's clamped gate -----------------------------------------------------------------------------------
#: (alpha, limit, shift): GPT-OSS's, DeepSeek-V4's (SiLU, no shift), a limit inside these inputs' range
CLAMPS = [(1.702, 7.0, 1.0), (1.0, 0.6, 0.0), (1.702, 0.4, 1.0)]


def _halves(gate_up: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return (gate_up[..., 0::2], gate_up[..., 1::2]) if interleaved else gate_up.chunk(2, dim=-1)


def _clamped_ref(gate_up: torch.Tensor, alpha: float, limit: float, shift: float, interleaved: bool) -> torch.Tensor:
    """GPT-OSS's ``_apply_gate`` (``modeling_gpt_oss.py``) in float64."""
    gate, up = _halves(gate_up.double(), interleaved)
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + shift) * (gate * torch.sigmoid(gate * alpha))


def _clamped_inputs(shape, dtype, device, limit: float) -> torch.Tensor:
    gu = rand(shape, dtype, device)
    gu[..., :4] = torch.tensor([limit, -limit, limit, -limit], dtype=torch.float64).to(dtype)  # on the bounds
    return gu


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_clamped_gate_matches_float64(backend, device, nan_memory, dtype, interleaved):
    """Forward and d(gate_up) against float64 for each (alpha, limit, shift), values on both sides
    of the clamps and on them (the gradient passes at a bound, as torch.clamp's)."""
    _kernels(backend)
    for alpha, limit, shift in CLAMPS:
        limit = lim = float(torch.tensor(limit, dtype=dtype))  # the bound as the dtype holds it: both compare to it
        gu = _clamped_inputs((2, 9, 70), dtype, device, lim).requires_grad_()
        dy = rand((2, 9, 35), dtype, device)
        with Unchanged(gu, dy):
            y = clamped_gated_activation(gu, alpha=alpha, limit=limit, shift=shift, interleaved=interleaved)
            assert y.shape == (2, 9, 35) and y.dtype == dtype and y.grad_fn is not None
            y.backward(dy)
        g64 = gu.detach().cpu().double().requires_grad_()
        ref = _clamped_ref(g64, alpha, limit, shift, interleaved)
        ref.backward(dy.cpu().double())
        scale = (abs(shift) + limit + 1) * (limit * alpha + 2)  # |y| and |dy/dg| / |dy| are at most about this
        err = (y.detach().double().cpu() - ref.detach()).abs()
        assert not torch.isnan(err).any(), "an element not written"
        assert (err <= RTOL[dtype] * ref.detach().abs() + 1e-5 * scale).all(), f"{alpha, limit, shift}: forward"
        got = gu.grad.double().cpu()
        bound = RTOL[dtype] * (g64.grad.abs() + dy.cpu().double().abs().repeat_interleave(2, -1) * scale) + 1e-6
        assert not torch.isnan(got).any() and (got - g64.grad).abs().le(bound).all(), f"{alpha, limit, shift}: grad"
        assert (g64.grad != 0).sum() < g64.numel() or limit > 6, "the clamps never bound"


def test_clamped_gate_double_backward_and_refusals(backend, device):
    """A graph-building backward differentiates PyTorch's composition; a limit or alpha that is
    not a finite number (or a negative limit) is left to the caller."""
    _kernels(backend)
    gu = rand((4, 10), torch.float32, device).requires_grad_()
    kw = dict(alpha=1.702, limit=0.5, shift=1.0, interleaved=True)
    (d,) = torch.autograd.grad(clamped_gated_activation(gu, **kw).sum(), gu, create_graph=True)
    (dd,) = torch.autograd.grad(d.sum(), gu)
    g64 = gu.detach().cpu().double().requires_grad_()
    (d64,) = torch.autograd.grad(_clamped_ref(g64, 1.702, 0.5, 1.0, True).sum(), g64, create_graph=True)
    (dd64,) = torch.autograd.grad(d64.sum(), g64)
    torch.testing.assert_close(d.double().cpu(), d64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dd.double().cpu(), dd64, rtol=1e-5, atol=1e-5)
    x = rand((3, 8), torch.float32, device)
    for bad in (dict(kw, limit=float("inf")), dict(kw, limit=-1.0), dict(kw, alpha=torch.tensor(1.0)),
                dict(kw, shift=float("nan"))):
        assert clamped_gated_activation(x, **bad) is None, bad
