"""The routed tokens' weighted sum and gather of a mixture-of-experts layer
(``ops/fused/experts_routing.py``): forward and gradients against PyTorch's composition (what
transformers' ``grouped_mm`` experts forward computes) and float64, into NaN-poisoned buffers,
inputs unchanged; the persistent and 64-bit-index forms; the calls it leaves to the caller."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import Unchanged, rand
from xkernels.ops.fused import experts_routing
from xkernels.ops.fused.experts_routing import combine_routed, gather_routed

#: (proj's dtype, the routing weights'): bf16 experts with fp32 router weights (Mixtral's), and each dtype alone
PAIRS = [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
         (torch.float32, torch.float32)]
#: a rounding of the product's dtype
EPS = {torch.float16: 2**-11, torch.bfloat16: 2**-8, torch.float32: 2**-24}
#: the spacing of the dtype's subnormals (an absolute error where a result underflows)
TINY = {torch.float16: 2**-24, torch.bfloat16: 2**-133, torch.float32: 2**-149}
#: (tokens, top_k, hidden): two column tiles of 256 and edge rows; 8 experts a token; one element
SHAPES = [(37, 2, 300), (5, 8, 64), (1, 1, 1)]


def _kernels(backend) -> None:
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: the routing passes leave the call to their caller")


def _routing(T: int, K: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, inv_perm) of T x K slots sorted by a random expert each, as transformers sorts them."""
    _, perm = torch.sort(torch.randint(0, 4, (T * K,)).to(device))
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=device)
    return perm, inv


def _transformers(proj, w, perm, inv, K, out_dtype):
    """transformers 5.23's weighted sum (``grouped_mm_experts_forward``), ``w`` in slot order."""
    T, H = proj.shape[0] // K, proj.shape[1]
    return (proj * w[perm].unsqueeze(-1))[inv].view(T, K, H).sum(dim=1).to(out_dtype)


@pytest.mark.parametrize("dtypes", PAIRS, ids=str)
def test_weighted_sum_is_pytorchs(backend, device, nan_memory, dtypes):
    """Each product rounded to its promoted dtype, summed in fp32: the composition's result bit for
    bit where the products round to 16 bits at top_k 2 (a two-term sum has one order; fp32
    products may be fused into the sum, FMA, which a GPU's compiler does), and float64's within the
    roundings everywhere."""
    _kernels(backend)
    pd, wd = dtypes
    for T, K, H in SHAPES:
        perm, inv = _routing(T, K, device)
        proj, w = rand((T * K, H), pd, device), torch.rand(T * K, dtype=torch.float32).to(wd).to(device)
        for order, p_order in ((inv, perm), (None, torch.arange(T * K, device=device))):  # sorted rows; in place
            with Unchanged(proj, w, inv):
                y = combine_routed(proj, w, order, K, pd)
            want = _transformers(proj, w, p_order, torch.argsort(p_order), K, pd)
            assert y.shape == (T, H) and y.dtype == pd and not torch.isnan(y).any()
            prod = torch.promote_types(pd, wd)
            if K <= 2 and prod != torch.float32:
                assert torch.equal(y, want)
            ref = _transformers(proj.double(), w.double(), p_order, torch.argsort(p_order), K, torch.float64)
            terms = _transformers(proj.double().abs(), w.double(), p_order, torch.argsort(p_order), K, torch.float64)
            bound = (K + 1) * EPS[prod] * terms + EPS[pd] * ref.abs() + TINY[pd]
            assert ((y.double() - ref).abs() <= bound).all()


@pytest.mark.parametrize("dtypes", PAIRS, ids=str)
def test_weighted_sum_gradients(backend, device, nan_memory, dtypes):
    """d(proj) (its sorted rows, in place) and d(weights) (a dot product per slot) against float64."""
    _kernels(backend)
    pd, wd = dtypes
    for T, K, H in SHAPES:
        perm, inv = _routing(T, K, device)
        proj = rand((T * K, H), pd, device).requires_grad_()
        w = torch.rand(T * K, dtype=torch.float32).to(wd).to(device).requires_grad_()
        dy = rand((T, H), pd, device)
        y = combine_routed(proj, w, inv, K, pd)
        assert y.grad_fn is not None
        with Unchanged(dy):
            y.backward(dy)
        p64, w64 = (v.detach().double().requires_grad_() for v in (proj, w))
        _transformers(p64, w64, perm, inv, K, torch.float64).backward(dy.double())
        prod = torch.promote_types(pd, wd)
        assert proj.grad.dtype == pd and w.grad.dtype == wd
        assert not torch.isnan(proj.grad).any() and not torch.isnan(w.grad).any()
        dp_bound = (EPS[prod] + EPS[pd]) * p64.grad.abs() + TINY[pd]
        assert ((proj.grad.double() - p64.grad).abs() <= dp_bound).all()
        dots = (dy.double().abs()[perm // K] * proj.detach().double().abs()).sum(-1)[inv]  # sum of |terms| per slot
        dw_bound = (H + 2) * EPS[prod] * dots + EPS[wd] * w64.grad.abs() + TINY[wd]
        assert ((w.grad.double() - w64.grad).abs() <= dw_bound).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gather_backward_sums_each_tokens_rows(backend, device, nan_memory, dtype):
    """``x[perm // K]``; its gradient each token's K rows summed in fp32, rounded once."""
    _kernels(backend)
    for T, K, H in SHAPES:
        perm, inv = _routing(T, K, device)
        x = rand((T, H), dtype, device).requires_grad_()
        with Unchanged(x, perm, inv):
            g = gather_routed(x, perm // K, inv, K)
        assert torch.equal(g, x.detach()[perm // K]) and g.grad_fn is not None
        dg = rand((T * K, H), dtype, device)
        g.backward(dg)
        want = torch.zeros(T, H, dtype=torch.float64, device=device).index_add(0, perm // K, dg.double())
        terms = torch.zeros(T, H, dtype=torch.float64, device=device).index_add(0, perm // K, dg.double().abs())
        assert x.grad.dtype == dtype
        assert ((x.grad.double() - want).abs() <= EPS[dtype] * want.abs() + K * 2**-24 * terms + TINY[dtype]).all()


def test_64_bit_offsets_compute_the_same(backend, device, monkeypatch):
    """The ``INDEX_64`` kernels (offsets past 2**31) give the 32-bit ones' results, both ways."""
    _kernels(backend)
    T, K, H = 9, 3, 40
    perm, inv = _routing(T, K, device)
    proj, w = rand((T * K, H), torch.float32, device), torch.rand(T * K, device=device)
    dy = rand((T, H), torch.float32, device)

    def run():
        p, v = proj.clone().requires_grad_(), w.clone().requires_grad_()
        y = combine_routed(p, v, inv, K, torch.float32)
        y.backward(dy)
        return y, p.grad, v.grad

    want = run()
    monkeypatch.setattr(experts_routing, "INT32_MAX", 0)
    experts_routing._plans.clear()
    try:
        got = run()
        plans = experts_routing._plans._plans.values()
        assert plans and all(p.constexprs["INDEX_64"] for p in plans)
    finally:
        experts_routing._plans.clear()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_double_backward_is_pytorchs(backend, device):
    """A backward that builds a graph differentiates PyTorch's composition."""
    _kernels(backend)
    T, K, H = 6, 2, 20
    perm, inv = _routing(T, K, device)
    proj = rand((T * K, H), torch.float32, device).requires_grad_()
    w = torch.rand(T * K, device=device).requires_grad_()
    (dp, dw) = torch.autograd.grad(combine_routed(proj, w, inv, K, torch.float32).square().sum(), (proj, w),
                                   create_graph=True)
    (ddp, ddw) = torch.autograd.grad((dp.sum() + dw.sum()), (proj, w))
    p64, w64 = (v.detach().double().requires_grad_() for v in (proj, w))
    (ep, ew) = torch.autograd.grad(_transformers(p64, w64, perm, inv, K, torch.float64).square().sum(), (p64, w64),
                                   create_graph=True)
    (eep, eew) = torch.autograd.grad((ep.sum() + ew.sum()), (p64, w64))
    for got, want in ((dp, ep), (dw, ew), (ddp, eep), (ddw, eew)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_calls_it_leaves_to_the_caller(backend, device):
    """``None`` (the caller runs PyTorch's ops) where the pass does not apply; never a result of
    other arguments."""
    T, K, H = 4, 2, 8
    _, inv = _routing(T, K, device)
    proj, w = rand((T * K, H), torch.float32, device), torch.rand(T * K, device=device)
    x = rand((T, H), torch.float32, device).requires_grad_()
    if not backend.runs_triton:
        assert combine_routed(proj, w, inv, K, torch.float32) is None
        assert gather_routed(x, inv // K, inv, K) is None
        return
    assert combine_routed(proj.double(), w, inv, K, torch.float32) is None  # fp64
    assert combine_routed(proj, w.double(), inv, K, torch.float32) is None
    assert combine_routed(proj, w, inv, 3, torch.float32) is None  # rows not a multiple of top_k
    assert combine_routed(proj, w[:-1], inv, K, torch.float32) is None  # a weight per slot
    assert combine_routed(proj, w, inv.float(), K, torch.float32) is None  # an order of floats
    assert combine_routed(proj.t(), w, inv, K, torch.float32) is None  # rows not contiguous
    assert combine_routed(proj, w, inv, K, torch.float32) is not None
    assert gather_routed(x.detach(), inv // K, inv, K) is None  # no gradient wanted: PyTorch's gather is the same
    assert gather_routed(x, inv[:-1] // K, inv, K) is None
    assert gather_routed(x, inv // K, inv, K) is not None


def test_cpu_backend_leaves_every_call():
    with xkernels.use_backend("cpu"):
        assert combine_routed(torch.randn(4, 3), torch.rand(4), None, 2, torch.float32) is None
