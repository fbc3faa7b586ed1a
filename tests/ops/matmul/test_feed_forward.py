"""Training's two-layer MLP as one autograd Function (``ops/matmul/feed_forward.py``): the
forward writes the pre-activation with the activation, the backward's input-gradient GEMM of the
down-projection applies the activation's derivative in its epilogue.

On CPU the kernels run in Triton's interpreter with the TMA path on; what the new kernel compiles
to for sm90: tests/ops/matmul/test_codegen.py.
"""

from __future__ import annotations

import pytest
import torch

from helpers import TMA_FORM_IDS as _FORM_IDS
from helpers import TMA_FORMS as _FORMS
from helpers import Unchanged, assert_close, poisoned, rand
from xkernels import tuning
from xkernels.ops import linear, matmul
from xkernels.ops.matmul import feed_forward, reference_linear
from xkernels.ops.matmul.vendor import activate

_ACTS = [("gelu", 0.01), ("gelu_tanh", 0.01), ("silu", 0.01), ("leaky_relu", -0.2), ("relu", 0.01)]


@pytest.fixture(autouse=True)
def _fresh_plans():
    feed_forward.forget()
    yield
    feed_forward.forget()


def _derivative(h: torch.Tensor, act: str, slope: float) -> torch.Tensor:
    """act'(h) in float64 by autograd of PyTorch's activation."""
    z = h.detach().double().requires_grad_()
    (d,) = torch.autograd.grad(activate(z, act, slope).sum(), z)
    return d


@pytest.mark.parametrize("cfg", _FORMS, ids=_FORM_IDS)
@pytest.mark.parametrize("act,slope", _ACTS, ids=[a for a, _ in _ACTS])
def test_the_kernel_applies_the_derivative_in_the_epilogue(tma_interpreter, cfg, act, slope):
    """``(dy @ W) * act'(h)`` and its column sums from one launch against float64, into a poisoned
    buffer, over edge tiles in M, N (F) and K (D); the inputs are left as they were."""
    M, D, F, dtype = 296, 72, 264, torch.float16
    x, w1, b1 = rand((M, D), dtype, "cpu"), rand((F, D), dtype, "cpu"), rand((F,), dtype, "cpu")
    w2, dy, h = rand((D, F), dtype, "cpu"), rand((M, D), dtype, "cpu"), rand((M, F), dtype, "cpu") * 2
    h[:3, :40] = 0  # the derivative at 0: PyTorch's (relu and leaky_relu take the negative side's)
    with tuning.force(cfg):
        plan = feed_forward.plan_for(linear, x, w1, b1, w2, None, act, slope)
    assert plan is not None
    out = poisoned((M, F), dtype, "cpu")
    with Unchanged(dy, w2, h):
        dh, db = plan.act_grad(dy, w2, h, into=out)
    assert dh.data_ptr() == out.data_ptr()
    want = (dy.double() @ w2.double()) * _derivative(h, act, slope)
    assert_close(dh, want, dtype, scale=D / 16)
    assert db.dtype == torch.float32 and db.shape == (F,)
    torch.testing.assert_close(db, dh.float().sum(0), rtol=1e-5, atol=1e-3)


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_()


def _reference(x, w1, b1, w2, b2, act, slope):
    return torch.nn.functional.linear(reference_linear(x, w1, b1, act, slope), w2, b2)


@pytest.mark.parametrize("act,slope", _ACTS, ids=[a for a, _ in _ACTS])
def test_a_training_block_matches_torchs_output_and_gradients(tma_interpreter, monkeypatch, act, slope):
    """The block with a gradient required: one launch of each fused kernel, the two backward GEMMs
    of the up-projection and the down-projection's weight gradient through ``matmul`` (3 GEMMs,
    none for the down-projection's input gradient), the output and every gradient against float64
    PyTorch; a 3-D x with biases, a 2-D x without."""
    fwd, bwd = [], []
    real_pre, real_grad = feed_forward.pre_activation.PreActivationPlan.__call__, feed_forward.ActGradPlan.__call__
    monkeypatch.setattr(feed_forward.pre_activation.PreActivationPlan, "__call__",
                        lambda self, *a, **k: fwd.append(1) or real_pre(self, *a, **k))
    monkeypatch.setattr(feed_forward.ActGradPlan, "__call__",
                        lambda self, *a, **k: bwd.append(1) or real_grad(self, *a, **k))
    dtype = torch.float16
    for x_shape, with_bias in (((2, 90, 40), True), ((130, 40), False)):
        x, w1, w2 = rand(x_shape, dtype, "cpu"), rand((72, 40), dtype, "cpu") / 4, rand((40, 72), dtype, "cpu") / 4
        b1, b2 = (rand((72,), dtype, "cpu"), rand((40,), dtype, "cpu")) if with_bias else (None, None)
        mine = [_leaf(t) for t in (x, w1, b1, w2, b2)]
        ref = [None if t is None else t.detach().double().requires_grad_() for t in (x, w1, b1, w2, b2)]
        with tuning.force(_FORMS[1]), Unchanged(x, w1, b1, w2, b2):
            y = feed_forward.recorded(linear, matmul, *mine, act, slope)
        assert y is not None and y.requires_grad and y.dtype == dtype and len(fwd) == 1
        want = _reference(*ref, act, slope)
        assert_close(y, want.detach(), dtype, scale=8.0)
        upstream = torch.randn(want.shape).to(dtype)
        gemms = []
        real_full = matmul._full_path
        monkeypatch.setattr(matmul, "_full_path", lambda a, k: gemms.append(1) or real_full(a, k))
        matmul._forget()
        with tuning.force(_FORMS[1]):
            y.backward(upstream)
        monkeypatch.setattr(matmul, "_full_path", real_full)
        want.backward(upstream.double())
        assert len(bwd) == 1 and len(gemms) == 3
        rows = x.numel() // 40
        for m, r in zip(mine, ref):
            if m is None:
                continue
            assert m.grad is not None and m.grad.dtype == dtype
            assert_close(m.grad, r.grad, dtype, scale=16.0 + rows / 8)
        fwd.clear()
        bwd.clear()


def test_a_double_backward_takes_the_unfused_differentiable_form(tma_interpreter):
    """A backward that builds a graph recomputes through the differentiable ops: second
    derivatives match float64 PyTorch's."""
    dtype = torch.float16
    x, w1, b1 = rand((70, 24), dtype, "cpu"), rand((40, 24), dtype, "cpu") / 4, rand((40,), dtype, "cpu")
    w2, b2 = rand((24, 40), dtype, "cpu") / 4, rand((24,), dtype, "cpu")
    mine = [_leaf(t) for t in (x, w1, b1, w2, b2)]
    with tuning.force(_FORMS[0]):
        y = feed_forward.recorded(linear, matmul, *mine, "gelu", 0.01)
        assert y is not None
        (gx,) = torch.autograd.grad(y.sum(), mine[0], create_graph=True)
        gx.square().sum().backward()
    ref = [t.detach().double().requires_grad_() for t in (x, w1, b1, w2, b2)]
    (rx,) = torch.autograd.grad(_reference(*ref, "gelu", 0.01).sum(), ref[0], create_graph=True)
    rx.square().sum().backward()
    for got, want in zip([gx.detach(), *(m.grad for m in mine)], [rx.detach(), *(r.grad for r in ref)]):
        assert (got is None) == (want is None)  # the output bias has no second-order path to gx
        if want is None:
            continue
        assert got.dtype == dtype and ((got.double() - want).abs().max() / want.abs().max()).item() < 2e-2


def test_blocks_it_cannot_take_run_unfused(tma_interpreter):
    """A down-projection weight of another shape, dtype or layout, a bias of the wrong length, or
    an up-projection without a TMA plan: no fused plan (the layers' own autograd runs)."""
    dtype = torch.float16
    x, w1, b1 = rand((64, 32), dtype, "cpu"), rand((48, 32), dtype, "cpu"), rand((48,), dtype, "cpu")
    w2 = rand((32, 48), dtype, "cpu")
    with tuning.force(_FORMS[0]):
        assert feed_forward.plan_for(linear, x, w1, b1, w2, None, "gelu", 0.01) is not None
        assert feed_forward.plan_for(linear, x, w1, b1, rand((32, 40), dtype, "cpu"), None, "gelu", 0.01) is None
        assert feed_forward.plan_for(linear, x, w1, b1, w2.float(), None, "gelu", 0.01) is None
        assert feed_forward.plan_for(linear, x, w1, b1, rand((48, 32), dtype, "cpu").t(), None, "gelu", 0.01) is None
        assert feed_forward.plan_for(linear, x, w1, b1, w2, rand((48,), dtype, "cpu"), "gelu", 0.01) is None
        assert feed_forward.plan_for(linear, x.float(), w1.float(), b1.float(), w2.float(), None, "gelu",
                                     0.01) is None  # fp32: no pre-activation kernel
    with tuning.force({**_FORMS[0], "TMA": False}):
        assert feed_forward.plan_for(linear, x, w1, b1, w2, None, "gelu", 0.01) is None


def test_on_the_device_at_berts_ffn_shape(backend, device):
    """Where the backend has tensor descriptors (an sm90 GPU), BERT's feed-forward block in
    training (8192 x 768 -> 3072 -> 768, bf16): on sm90 the table lets the fused block run, and
    its output and every gradient match float64 PyTorch on the device."""
    if not backend.runs_triton or not backend.tensor_descriptors(device):
        pytest.skip(f"backend {backend.name!r} has no tensor descriptors here")
    dtype = torch.bfloat16
    x = rand((8192, 768), dtype, device)
    w1, b1 = rand((3072, 768), dtype, device) / 28, rand((3072,), dtype, device)
    w2, b2 = rand((768, 3072), dtype, device) / 56, rand((768,), dtype, device)
    fused = feed_forward.plan_for(linear, x, w1, b1, w2, b2, "gelu", 0.01)
    if backend.arch(device) == "sm90":
        assert fused is not None, linear.explain(x, w1, b1, "gelu")
    if fused is None:
        pytest.skip("no fused block on this device's table")
    mine = [_leaf(t) for t in (x, w1, b1, w2, b2)]
    ref = [t.detach().double().requires_grad_() for t in (x, w1, b1, w2, b2)]
    with Unchanged(x, w1, b1, w2, b2):
        y = feed_forward.recorded(linear, matmul, *mine, "gelu", 0.01)
    want = _reference(*ref, "gelu", 0.01)
    assert_close(y.detach(), want.detach(), dtype, scale=8.0)
    upstream = torch.randn(want.shape, device=device).to(dtype)
    y.backward(upstream)
    want.backward(upstream.double())
    for m, r in zip(mine, ref):
        assert_close(m.grad, r.grad, dtype, scale=16.0 + 8192 / 8)
