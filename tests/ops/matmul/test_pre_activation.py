"""Training's linear + activation in one kernel (``ops/matmul/pre_activation.py``): the TMA kernel
writes the output and the pre-activation, and the backward reads the latter.

On CPU the kernel runs in Triton's interpreter with the TMA path on (the interpreter runs tensor
descriptors); when it runs on an sm90 device is a table question, checked on the cuda backend's
own sm90 rules with meta tensors; what it compiles to for sm90: tests/ops/matmul/test_codegen.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import xkernels
from helpers import TMA_FORM_IDS as _FORM_IDS
from helpers import TMA_FORMS as _FORMS
from helpers import TMA_TINY as _TINY
from helpers import Unchanged, assert_close, poisoned, rand
from xkernels import dispatch, tuning
from xkernels.ops import linear, matmul
from xkernels.ops.matmul import pre_activation, reference_linear
from xkernels.ops.matmul.vendor import activate

_ACTS = [("gelu", 0.01), ("gelu_tanh", 0.01), ("silu", 0.01), ("leaky_relu", -0.2)]


def _pre(x, w, b):
    return torch.nn.functional.linear(x, w, b)


@pytest.mark.parametrize("cfg", _FORMS, ids=_FORM_IDS)
@pytest.mark.parametrize("act,slope", _ACTS, ids=[a for a, _ in _ACTS])
def test_the_kernel_writes_the_output_and_the_pre_activation(tma_interpreter, cfg, act, slope):
    """Both results of one launch against float64 references, into poisoned buffers, over edge
    tiles in M, N and K (5 x 5 tiles of 64 x 64; 3 or 6 programs when persistent)."""
    M, K, N, dtype = 296, 72, 264, torch.float16
    x, w, b = rand((M, K), dtype, "cpu"), rand((N, K), dtype, "cpu"), rand((N,), dtype, "cpu")
    with tuning.force(cfg):
        pre = pre_activation.plan_for(linear, x, w, b, act, slope)
    assert pre is not None and pre.plan.tma is not None
    y, h = poisoned((M, N), dtype, "cpu"), poisoned((M, N), dtype, "cpu")
    with Unchanged(x, w, b):
        got_y, got_h = pre(x, w, b, into=(y, h))
    assert got_y.data_ptr() == y.data_ptr() and got_h.data_ptr() == h.data_ptr()
    ref_h = _pre(x.double(), w.double(), b.double())
    assert_close(h, ref_h, dtype, scale=K / 16)
    assert_close(y, reference_linear(x.double(), w.double(), b.double(), act, slope), dtype, scale=K / 16)


def _leaf(t):
    return t.detach().clone().requires_grad_()


@pytest.mark.parametrize("act,slope", _ACTS, ids=[a for a, _ in _ACTS])
def test_training_calls_store_the_pre_activation_and_match_torchs_gradients(tma_interpreter, monkeypatch, act,
                                                                            slope):
    """``linear`` with a gradient required runs the one kernel (counted) and the backward reads
    its pre-activation: no GEMM recomputes it (the backward's GEMMs are counted: d(x), d(weight)).
    Output and every gradient against float64 PyTorch; a 3-D x, and a call without bias."""
    launches = []
    real = pre_activation.PreActivationPlan.__call__

    def counted(self, *args, **kwargs):
        launches.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pre_activation.PreActivationPlan, "__call__", counted)
    dtype = torch.float16
    for x_shape, with_bias in (((2, 90, 40), True), ((130, 40), False)):
        x, w = rand(x_shape, dtype, "cpu"), rand((72, 40), dtype, "cpu")
        b = rand((72,), dtype, "cpu") if with_bias else None
        mine = [_leaf(t) for t in (x, w, b) if t is not None]
        ref = [t.detach().double().requires_grad_() for t in (x, w, b) if t is not None]
        before = len(launches)
        with tuning.force(_FORMS[1]), Unchanged(x, w, b):
            y = linear(*mine[:2], mine[2] if with_bias else None, act, negative_slope=slope)
        assert len(launches) == before + 1 and y.requires_grad and y.dtype == dtype
        want = reference_linear(*ref[:2], ref[2] if with_bias else None, act, slope)
        assert_close(y, want.detach(), dtype, scale=4.0)
        upstream = torch.randn(want.shape).to(dtype)
        gemms = []
        real_full = matmul._full_path
        monkeypatch.setattr(matmul, "_full_path", lambda a, k: gemms.append(1) or real_full(a, k))
        matmul._forget()
        with tuning.force(_FORMS[1]):
            y.backward(upstream)
        monkeypatch.setattr(matmul, "_full_path", real_full)
        want.backward(upstream.double())
        assert len(gemms) == 2  # d(x) and d(weight): the pre-activation was not recomputed
        for m, r in zip(mine, ref):
            assert m.grad is not None and m.grad.dtype == dtype
            assert_close(m.grad, r.grad, dtype, scale=8.0 + x.numel() // x.shape[-1] / 16)


def test_a_double_backward_recomputes_the_pre_activation(tma_interpreter):
    """The stored pre-activation has no history: a backward that builds a graph (create_graph)
    recomputes it through ``linear``, so second derivatives are those of the unfused form (the
    pointer kernel, same blocks: bit for bit) and PyTorch's."""
    dtype = torch.float16
    x, w, b = rand((70, 24), dtype, "cpu"), rand((40, 24), dtype, "cpu"), rand((40,), dtype, "cpu")
    grads = []
    for cfg in (_TINY, {**_TINY, "TMA": False}):
        mine = [_leaf(t) for t in (x, w, b)]
        with tuning.force(cfg):
            (gx,) = torch.autograd.grad(linear(*mine, "gelu").sum(), mine[0], create_graph=True)
            gx.square().sum().backward()
        grads.append([gx.detach(), *(m.grad for m in mine)])
    assert all(torch.equal(f, u) for f, u in zip(*grads))
    ref = [t.detach().double().requires_grad_() for t in (x, w, b)]
    (rx,) = torch.autograd.grad(reference_linear(*ref, "gelu").sum(), ref[0], create_graph=True)
    rx.square().sum().backward()
    for got, want in zip(grads[0], [rx.detach(), *(r.grad for r in ref)]):  # fp16 GEMMs of rounded terms
        assert got.dtype == dtype and ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-2


def test_the_module_path_runs_it_in_training(tma_interpreter, monkeypatch):
    """``xkernels.nn.Linear(..., activation="gelu")`` in training takes the same kernel."""
    launches = []
    real = pre_activation.PreActivationPlan.__call__
    monkeypatch.setattr(pre_activation.PreActivationPlan, "__call__",
                        lambda self, *a, **k: launches.append(1) or real(self, *a, **k))
    torch.manual_seed(0)
    mod = xkernels.nn.Linear(40, 72, activation="gelu", dtype=torch.float16)
    x = rand((3, 50, 40), torch.float16, "cpu").requires_grad_()
    with tuning.force(_FORMS[1]):
        y = mod(x)
    assert launches and y.requires_grad
    with tuning.force(_FORMS[1]):
        said = str(linear.explain(x, mod.weight, mod.bias, "gelu"))
    assert "with a gradient: one kernel writes the output and the pre-activation" in said, said
    ref = activate(torch.nn.functional.linear(x.double(), mod.weight.double(), mod.bias.double()), "gelu", 0.01)
    assert_close(y.detach(), ref.detach(), torch.float16, scale=4.0)
    y.float().sum().backward()
    assert x.grad is not None and mod.weight.grad is not None and mod.bias.grad is not None


def test_no_fused_form_without_a_tma_plan(monkeypatch):
    """Where the call's plan is not the TMA kernel (here: the interpreter without tensor
    descriptors), nothing launches and the unfused form runs; relu never asks (its derivative is
    read off the output)."""
    be = dispatch.get_backend("interpreter")
    if be.unavailable_reason():
        pytest.skip(be.unavailable_reason())
    pre_activation.forget()
    x, w, b = rand((64, 32), torch.float16, "cpu"), rand((48, 32), torch.float16, "cpu"), rand((48,), torch.float16,
                                                                                                 "cpu")
    with xkernels.use_backend("interpreter"), tuning.force(_TINY):
        assert pre_activation.plan_for(linear, x, w, b, "gelu", 0.01) is None
        y = linear(_leaf(x), w, b, "gelu")
    assert y.grad_fn is not None and "LinearFunction" not in type(y.grad_fn).__name__  # PyTorch's gelu
    pre_activation.forget()


@pytest.mark.parametrize("ratio,rho,fused", [(1.32, 0.26, True), (1.15, 0.26, False), (1.06, 0.05, True),
                                             (1.04, 0.05, False), (0.97, 0.0, False)])
def test_the_extra_write_must_be_paid_by_the_rules_speedup(ratio, rho, fused):
    assert pre_activation.pays(ratio, rho) is fused


def test_sm90_rules_decide_where_it_runs():
    """On the cuda backend's sm90 table: BERT's and ViT's FFN up-projection with gelu (bf16; the
    rules measured 1.32x / 1.30x torch) run fused in training; an fp16 gelu at 8192 tokens (its
    rule measured 1.048x) and a shape whose plan is the BLAS do not."""
    from test_codegen import _H100, _ffn_call, _meta

    be = _H100()
    for m, expect in ((8192, True), (12608, True)):
        plan = linear.make_plan(linear.check(*_ffn_call(m)), be)
        assert pre_activation.eligible(plan, be, torch.device("meta"), 2) is expect, (m, plan.selection.record)
    half = (_meta(8192, 768, dtype=torch.float16), _meta(3072, 768, dtype=torch.float16),
            _meta(3072, dtype=torch.float16), "gelu")
    call = linear.check(*half)
    plan = linear.make_plan(call, be)
    assert plan.tma is not None and not pre_activation.eligible(plan, be, torch.device("meta"), 2)
    said = pre_activation.describe(half[0], call, be, plan)  # what explain() says of it
    assert "then PyTorch's gelu" in said and "does not pay" in said and "1.048" in said, said
    call = linear.check(*_ffn_call(8192))
    said = pre_activation.describe(call.a, call, be, linear.make_plan(call, be))
    assert said.startswith("one kernel writes the output and the pre-activation") and "stored too" in said, said


def test_on_the_device_at_berts_ffn_shape(backend, device):
    """Where the backend has tensor descriptors (an sm90 GPU), BERT's FFN up-projection with gelu
    in training: the table's rule lets the one kernel run (on sm90), and the output and every
    gradient match float64 PyTorch on the device."""
    if not backend.runs_triton or not backend.tensor_descriptors(device):
        pytest.skip(f"backend {backend.name!r} has no tensor descriptors here")
    dtype = torch.bfloat16
    x, w, b = rand((8192, 768), dtype, device), rand((3072, 768), dtype, device) / 28, rand((3072,), dtype, device)
    fused = pre_activation.plan_for(linear, x, w, b, "gelu", 0.01)
    if backend.arch(device) == "sm90":
        assert fused is not None, linear.explain(x, w, b, "gelu")
    mine = [_leaf(t) for t in (x, w, b)]
    ref = [t.detach().double().requires_grad_() for t in (x, w, b)]
    with Unchanged(x, w, b):
        y = linear(*mine, "gelu")
    want = reference_linear(*ref, "gelu")
    assert_close(y.detach(), want.detach(), dtype, scale=4.0)
    upstream = torch.randn(want.shape, device=device).to(dtype)
    y.backward(upstream)
    want.backward(upstream.double())
    for m, r in zip(mine, ref):
        assert_close(m.grad, r.grad, dtype, scale=8.0 + 8192 / 16)


def test_a_module_reused_with_new_shapes_and_strides_matches_torch_each_time(tma_interpreter, monkeypatch):
    """One ``xkernels.nn.Linear(..., activation="gelu")`` in training, called with new leading
    shapes, a non-contiguous x (the unfused form: no plan is reused for it), then the first shape
    again: each output and gradient against float64 PyTorch, and the fused kernel ran exactly for
    the contiguous calls (a plan is never reused for another signature)."""
    launches = []
    real = pre_activation.PreActivationPlan.__call__

    def counted(self, x, *args, **kwargs):
        launches.append((tuple(x.shape), self.plan.dims))
        return real(self, x, *args, **kwargs)

    monkeypatch.setattr(pre_activation.PreActivationPlan, "__call__", counted)
    torch.manual_seed(1)
    mod = xkernels.nn.Linear(40, 72, activation="gelu", dtype=torch.float16)
    wide = rand((40, 130), torch.float16, "cpu")
    for x in (rand((3, 50, 40), torch.float16, "cpu"), rand((130, 40), torch.float16, "cpu"), wide.t(),
              rand((3, 50, 40), torch.float16, "cpu")):
        before = len(launches)
        xl = x.detach().clone() if x.is_contiguous() else x.detach()
        xl.requires_grad_()
        mod.zero_grad(set_to_none=True)
        with tuning.force(_FORMS[1]):
            y = mod(xl)
        m_rows = x.numel() // 40
        assert len(launches) == before + (1 if x.is_contiguous() else 0)
        if x.is_contiguous():
            assert launches[-1] == (tuple(x.shape), (m_rows, 72, 40))
        ref_x, ref_w, ref_b = (t.detach().double().requires_grad_() for t in (x, mod.weight, mod.bias))
        want = activate(torch.nn.functional.linear(ref_x, ref_w, ref_b), "gelu", 0.01)
        assert_close(y.detach(), want.detach(), torch.float16, scale=4.0)
        upstream = torch.randn(want.shape).to(torch.float16)
        y.backward(upstream)
        want.backward(upstream.double())
        assert_close(xl.grad, ref_x.grad, torch.float16, scale=8.0)
        assert_close(mod.weight.grad, ref_w.grad, torch.float16, scale=8.0 + m_rows / 16)
        assert_close(mod.bias.grad, ref_b.grad, torch.float16, scale=8.0 + m_rows / 16)


def _first_use_clock(kernel_ms: float, blas_ms: float):
    """A fake first-use clock (``evidence.timer``): runs each route once, reports fixed times."""
    from xkernels.ops.matmul import evidence

    def timer(fns, backend, device):
        for fn in fns:
            fn()
        return [[kernel_ms, blas_ms]] * evidence.CHECK_ROUNDS
    return timer


@pytest.mark.parametrize("blas_ms,fused", [(2.0, True), (1.1, False)])
def test_a_first_use_checks_ratio_decides_where_no_rule_measured_the_call(tma_interpreter, tmp_path, monkeypatch,
                                                                           blas_ms, fused):
    """No table rule covers quick_gelu at this shape: on a backend with a BLAS alternative the call
    waits for evidence, and the first-use check on the device (a fake clock here) settles it. Its
    device ratio then stands for a rule's ``worst_ratio``: 2.0x pays for the extra write and the
    training call runs the one kernel; 1.1x picks the kernel for inference but does not pay here
    (explain says which). Either way the gradients are PyTorch's."""
    from xkernels.ops.matmul import evidence

    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("XKERNELS_FIRST_USE_CHECK", raising=False)
    monkeypatch.delenv("XKERNELS_AUTOTUNE", raising=False)
    monkeypatch.setattr(tma_interpreter, "kernel_needs_evidence", True, raising=False)
    monkeypatch.setattr(pre_activation, "result_write_fraction", lambda *a: 0.26)  # BERT's FFN on an H100: 1.21x
    monkeypatch.setattr(evidence, "timer", _first_use_clock(1.0, blas_ms))
    from xkernels.ops.matmul import config as matmul_config

    real_select = matmul_config.select  # the wave model's pick, made the TMA kernel (as on sm90)
    monkeypatch.setattr(matmul_config, "select", lambda *a, **k: dataclasses.replace(
        real_select(*a, **k), config=dict(_FORMS[1]), measured=False))
    evidence.forget()
    launches = []
    real = pre_activation.PreActivationPlan.__call__
    monkeypatch.setattr(pre_activation.PreActivationPlan, "__call__",
                        lambda self, *a, **k: launches.append(1) or real(self, *a, **k))
    torch.manual_seed(0)
    x = rand((96, 40), torch.float16, "cpu").requires_grad_()
    w, b = rand((72, 40), torch.float16, "cpu").requires_grad_(), rand((72,), torch.float16, "cpu").requires_grad_()
    try:
        with Unchanged(x, w, b):
            y = linear(x, w, b, "quick_gelu")
        plan = linear._decide(linear.check(x, w, b, "quick_gelu"))[1]
        assert plan.tma is not None and not plan.measured, plan.selection.why  # the wave model's TMA kernel, checked
        assert evidence.measured_ratio(plan.selection) == pytest.approx(blas_ms)
        assert bool(launches) is fused
        said = str(linear.explain(x, w, b, "quick_gelu"))
        if fused:
            assert "with a gradient: one kernel writes the output and the pre-activation" in said, said
        else:
            assert f"a first-use check's measured speedup ({blas_ms})" in said and "does not pay" in said, said
        ref = activate(torch.nn.functional.linear(x.double(), w.double(), b.double()), "quick_gelu", 0.01)
        assert_close(y.detach(), ref.detach(), torch.float16, scale=4.0)
        grads = torch.autograd.grad(y.float().sum(), (x, w, b))
        want = torch.autograd.grad(ref.sum(), (x, w, b))
        for g, r in zip(grads, want, strict=True):
            assert_close(g, r, torch.float16, scale=16.0)
    finally:
        evidence.forget()
