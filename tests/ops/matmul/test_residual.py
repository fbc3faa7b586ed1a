"""``linear(x, weight, bias, activation, residual=r)``: the residual added in the epilogue.

Forward against float64 (every kernel dtype, activations, bias, residual layouts, promotion),
``out=`` (poisoned, aliasing the residual), split-K and TMA forms, the vendor-BLAS route,
gradients, ``torch.compile(fullgraph=True)``, bad input raising before anything is written, and
no hot entry shared between calls with and without a residual.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import Unchanged, every_matmul_to_vendor, poisoned, rand
from xkernels import tuning
from xkernels.backends.interpreter import InterpreterBackend
from xkernels.ops import linear
from xkernels.ops.matmul.vendor import reference_linear

F = torch.nn.functional
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
#: unit roundoff of each dtype: the unfused routes round act(x @ W.T + b) to x's dtype, then the sum
U = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
B, S, K, N = 2, 3, 24, 16
_POINTER = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}


def _reference(x, w, b, act, r, slope=0.01):
    """float64 ``act(F.linear(x, w, b)) + r`` and the magnitude its rounding errors scale with."""
    d = lambda t: None if t is None else t.detach().double().cpu()  # noqa: E731
    ref = reference_linear(d(x), d(w), d(b), act, slope) + d(r)
    mag = F.linear(d(x).abs(), d(w).abs(), None if b is None else d(b).abs()) + d(r).abs()
    return ref, mag


def _check(got, x, w, b, act, r, dtype=None, slope=0.01):
    """``got`` within the rounding of the kernel route (fp32 accumulation, one rounding) or of the
    unfused ones (two roundings in x's dtype), relative to the magnitude, of the float64 result."""
    ref, mag = _reference(x, w, b, act, r, slope)
    want_dtype = dtype or (torch.promote_types(x.dtype, r.dtype) if r.dim() else x.dtype)
    assert got.dtype == want_dtype and got.shape == ref.shape, (got.dtype, got.shape, want_dtype, ref.shape)
    err = (got.detach().double().cpu() - ref).abs()
    bound = (4 * U[x.dtype] + 16 * math.sqrt(x.shape[-1]) * 2.0**-24) * 1.2 * mag + 1e-6
    assert not torch.isnan(got).any(), "NaN left in the output (element not written?)"
    assert (err <= bound).all(), f"max error {float(err.max()):.3g}, at most {float((err / bound).max()):.3g}x the bound"


def _residuals(dtype, device):
    """Residual layouts over an output of shape (B, S, N), by name."""
    return {
        "full": rand((B, S, N), dtype, device),
        "(N,)": rand((N,), dtype, device),
        "(1, N)": rand((1, N), dtype, device),
        "(B, 1, N) over a batch": rand((B, 1, N), dtype, device),
        "transposed": rand((N, S, B), dtype, device).permute(2, 1, 0),
        "step-sliced": rand((B, S, 2 * N), dtype, device)[..., ::2],
        "(S, 1) column": rand((S, 1), dtype, device),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_matches_float64(backend, device, dtype):
    """Every residual layout, with and without bias, with no activation and each kind of one."""
    x, w, b = rand((B, S, K), dtype, device), rand((N, K), dtype, device), rand((N,), dtype, device)
    for name, r in _residuals(dtype, device).items():
        for bias, act in ((None, None), (b, None), (b, "gelu"), (None, "relu"), (b, "leaky_relu")):
            with Unchanged(x, w, b, r):
                got = linear(x, w, bias, act, negative_slope=0.2, residual=r)
            _check(got, x, w, bias, act, r, slope=0.2)
        if backend.runs_triton:
            assert "residual" in linear.explain(x, w, residual=r).variant, name
            # the kernels themselves (on cuda the tables may pick the BLAS): pointer, and TMA where
            # the device loads through tensor descriptors (16-byte rows: fp16/bf16 here)
            for cfg in (_POINTER, {**_POINTER, "TMA": True, "PERSISTENT": True}):
                with tuning.force(cfg):
                    exp = linear.explain(x, w, b, "gelu", residual=r)
                    assert exp.route == "triton kernel" and "residual" in exp.variant, exp
                    out = poisoned((B, S, N), torch.result_type(x, r) if r.dim() else dtype, device)
                    with Unchanged(x, w, b, r):
                        linear(x, w, b, "gelu", residual=r, out=out)
                    _check(out, x, w, b, "gelu", r)


def test_residual_needing_a_copy_and_1d_x(backend, device):
    """A residual whose broadcast leading dims collapse to three strides is copied to contiguous
    rows first (explain() says so); a 1-D x gives a 1-D result."""
    x, w = rand((2, 3, 4, K), torch.float32, device), rand((N, K), torch.float32, device)
    r = rand((2, 1, 4, N), torch.float32, device)
    with Unchanged(x, w, r):
        _check(linear(x, w, residual=r), x, w, None, None, r)
    if backend.runs_triton:  # the kernel route (forced: on cuda the tables may pick the BLAS)
        with tuning.force({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}):
            assert "copied" in linear.explain(x, w, residual=r).config["residual"]
            with Unchanged(x, w, r):
                _check(linear(x, w, residual=r), x, w, None, None, r)
    x1, r1 = rand((K,), torch.float32, device), rand((N,), torch.float32, device)
    _check(linear(x1, w, residual=r1), x1, w, None, None, r1)


def test_out_and_in_place(backend, device):
    """out= a separate poisoned tensor; out= the residual itself (contiguous, and a transposed view)."""
    dtype = torch.float16
    x, w, b = rand((B, S, K), dtype, device), rand((N, K), dtype, device), rand((N,), dtype, device)
    r = rand((B, S, N), dtype, device)
    out = poisoned((B, S, N), dtype, device)
    with Unchanged(x, w, b, r):
        assert linear(x, w, b, residual=r, out=out) is out
    _check(out, x, w, b, None, r)
    for r in (rand((B, S, N), dtype, device), rand((N, S, B), dtype, device).permute(2, 1, 0)):
        before = r.clone()
        with Unchanged(x, w, b):
            assert linear(x, w, b, "gelu", residual=r, out=r) is r
        _check(r, x, w, b, "gelu", before)


def test_type_promotion(backend, device):
    """The result dtype is torch's for ``F.linear(x, w) + r``: a float32 residual promotes half x
    (the kernel adds in fp32 and writes fp32), a 0-d one does not, float64 runs PyTorch."""
    for xd, rd, shape in ((torch.bfloat16, torch.float32, (B, S, N)), (torch.float16, torch.float32, (N,)),
                          (torch.float16, torch.float32, ()), (torch.float32, torch.float16, (B, S, N))):
        x, w, r = rand((B, S, K), xd, device), rand((N, K), xd, device), rand(shape, rd, device)
        want = (F.linear(x.float(), w.float()).to(xd) + r).dtype
        got = linear(x, w, residual=r)
        assert got.dtype == want, (xd, rd, shape, got.dtype, want)
        _check(got, x, w, None, None, r, dtype=want)
    x, w, r = rand((B, S, K), torch.float32, device), rand((N, K), torch.float32, device), rand((N,), torch.float64,
                                                                                                   device)
    got = linear(x, w, residual=r)
    assert got.dtype == torch.float64
    assert "float64" in linear.check(x, w, residual=r).fallback_reason
    _check(got, x, w, None, None, r, dtype=torch.float64)


def test_bad_input_raises_before_anything_is_written(backend, device):
    x, w = rand((B, S, K), torch.float32, device), rand((N, K), torch.float32, device)
    r = rand((B, S, N), torch.float32, device)
    out = poisoned((B, S, N), torch.float32, device)
    cases = [
        (dict(residual=rand((N + 1,), torch.float32, device)), ValueError,
         r"'residual' of shape \(17,\) does not broadcast to the result of shape \(2, 3, 16\)"),
        (dict(residual=rand((4, B, S, N), torch.float32, device)), ValueError,
         r"'residual' of shape \(4, 2, 3, 16\) does not broadcast .*it would grow it to \(4, 2, 3, 16\)"),
        (dict(residual=torch.ones((B, S, N), dtype=torch.int32, device=device)), TypeError,
         "'residual' must be a floating-point tensor, got dtype torch.int32"),
        (dict(residual=3.0), TypeError, "argument 'residual' must be a torch.Tensor"),
        (dict(residual=torch.empty((B, S, N), device="meta")), ValueError, "tensors must be on one device"),
        (dict(residual=rand((B, S, N), torch.float64, device)), TypeError,
         "'residual' of dtype torch.float64 promotes the result to torch.float64, 'out' has dtype torch.float32"),
        (dict(residual=r[:, :, :8].expand(B, S, 8)), ValueError, "does not broadcast"),
    ]
    for kwargs, exc, match in cases:
        with Unchanged(x, w, r), pytest.raises(exc, match=match):
            linear(x, w, **kwargs, out=out)
        with pytest.raises(exc, match=match):
            linear.explain(x, w, **kwargs, out=out)
    x_sq = rand((B, S, N), torch.float32, device)
    w_sq = rand((N, N), torch.float32, device)
    with Unchanged(x_sq, r), pytest.raises(ValueError, match="'out' is input 'x'"):
        linear(x_sq, w_sq, residual=r, out=x_sq)
    big = rand((B, S, N + 1), torch.float32, device)
    with Unchanged(big), pytest.raises(ValueError, match="partially overlaps input 'residual'"):
        linear(x, w, residual=big[..., :N], out=big[..., 1:])
    assert torch.isnan(out).all()


def test_no_hot_entry_is_shared_with_a_residual(backend, device):
    """Calls without a residual keep their hot entries; a call with one never takes them (nor
    leaves one: it runs the full path every time), whatever the form of the call."""
    x, w = rand((B, S, K), torch.float32, device), rand((N, K), torch.float32, device)
    for _ in range(2):
        linear(x, w)
    r = rand((B, S, N), torch.float32, device)
    for _ in range(2):
        _check(linear(x, w, residual=r), x, w, None, None, r)
        _check(linear(x, w, None, None, residual=r), x, w, None, None, r)
    assert linear.hot_entry(x, w, residual=r) is None
    assert linear.hot_entry(x, w, None, None, residual=r) is None
    _check(linear(x, w), x, w, None, None, torch.zeros((), dtype=torch.float32))


_SPLIT = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 3, "SPLIT_K": 2}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_split_k_adds_the_residual_in_the_reduction(backend, device, dtype):
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no kernel config to force")
    x, w, b = rand((5, 64), dtype, device), rand((N, 64), dtype, device), rand((N,), dtype, device)
    with tuning.force(_SPLIT):
        for r in (rand((5, N), dtype, device), rand((N,), dtype, device)):
            exp = linear.explain(x, w, b, "silu", residual=r)
            assert exp.config.get("SPLIT_K") == 2 and "residual" in exp.variant
            out = poisoned((5, N), dtype, device)
            with Unchanged(x, w, b, r):
                linear(x, w, b, "silu", residual=r, out=out)
            _check(out, x, w, b, "silu", r)


def test_vendor_route(backend, device, monkeypatch):
    """A vendor-BLAS plan: no bias and activation is ``torch.addmm`` with the residual as C (in
    place for out= the residual); otherwise the vendor epilogue, then the residual added in place."""
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no kernel selection")
    dtype = torch.float32
    x, w, b = rand((B, S, K), dtype, device), rand((N, K), dtype, device), rand((N,), dtype, device)
    with every_matmul_to_vendor(monkeypatch):
        for r in _residuals(dtype, device).values():
            e = linear.explain(x, w, residual=r)
            assert e.route == "vendor BLAS" and "torch.addmm(residual" in e.variant, e
            assert "added in place" in linear.explain(x, w, b, "gelu", residual=r).variant
            with Unchanged(x, w, b, r):
                _check(linear(x, w, residual=r), x, w, None, None, r)
                _check(linear(x, w, b, "gelu", residual=r), x, w, b, "gelu", r)
                out = poisoned((B, S, N), dtype, device)
                assert linear(x, w, residual=r, out=out) is out
            _check(out, x, w, None, None, r)
        r = rand((B, S, N), dtype, device)
        before = r.clone()
        assert linear(x, w, residual=r, out=r) is r
        _check(r, x, w, None, None, before)
        xh, wh, r32 = x.half(), w.half(), rand((B, S, N), dtype, device)  # a promoting residual: F.linear, then +
        assert "then the residual added (promoting" in linear.explain(xh, wh, residual=r32).variant
        _check(linear(xh, wh, residual=r32), xh, wh, None, None, r32)


def _grad_inputs(dtype, device, r_shape):
    x, w, b = rand((B, S, K), dtype, device), rand((N, K), dtype, device), rand((N,), dtype, device)
    return x, w, b, rand(r_shape, dtype, device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("act", [None, "relu", "gelu"], ids=str)
def test_gradients(backend, device, dtype, act):
    """Every input's gradient against float64 PyTorch; a broadcast residual's is summed over its
    broadcast dims, in its dtype; a promoting residual gives x, w, b theirs in their dtype."""
    for r_shape, r_dtype in (((B, S, N), dtype), ((N,), dtype), ((B, 1, N), torch.float32)):
        x, w, b, r = _grad_inputs(dtype, device, r_shape)
        r = r.to(r_dtype)
        if act == "relu":  # pre-activations away from 0: relu's mask must not hinge on rounding
            sign = torch.where(torch.arange(N, device=device) % 2 == 0, 1.0, -1.0)[:, None]
            x, w, b = (x.abs() + 0.5).to(dtype), ((w.abs() + 0.5) * sign / K).to(dtype), (b * 0.01).to(dtype)
        mine = [t.detach().clone().requires_grad_() for t in (x, w, b, r)]
        ref = [t.detach().double().cpu().requires_grad_() for t in (x, w, b, r)]
        with Unchanged(x, w, b, r):
            y = linear(*mine[:3], act, residual=mine[3])
        want = reference_linear(*ref[:3], act) + ref[3]
        assert y.requires_grad and y.dtype == torch.promote_types(dtype, r_dtype)
        up = torch.randn(want.shape, dtype=torch.float64).to(y.dtype)
        y.backward(up.to(device))
        want.backward(up.double())
        for m, rf in zip(mine, ref):
            assert m.grad is not None and m.grad.dtype == m.dtype and m.grad.shape == m.shape
            # sums of up to max(K, B*S) products (x's and w's gradients), rounded in the operand's dtype;
            # compared with the largest gradient (elements near zero carry the sums' absolute error)
            scale = (8 * U[m.dtype] + 64 * math.sqrt(max(K, B * S)) * 2.0**-24) * float(rf.grad.abs().max())
            err = (m.grad.double().cpu() - rf.grad).abs()
            assert float(err.max()) <= scale + 1e-6, (r_shape, float(err.max()), scale)


def test_compile_fullgraph(backend, device):
    """One ``xkernels.linear`` node with the residual; result and gradients as eager's; out= the
    residual under compile is computed functionally and copied."""
    torch._dynamo.reset()
    seen = []

    def count(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def block(x, w, b, r):
        return linear(x, w, b, residual=r)

    x, w, b, r = _grad_inputs(torch.float32, device, (N,))
    with torch.no_grad():
        torch.compile(block, fullgraph=True, backend=count)(x, w, b, r)
    assert [s for s in seen if "xkernels" in s] == ["xkernels.linear.default"], seen
    torch._dynamo.reset()
    leaves = [t.clone().requires_grad_() for t in (x, w, b, r)]
    y = torch.compile(block, fullgraph=True, backend="aot_eager")(*leaves)
    _check(y, x, w, b, None, r)
    y.square().sum().backward()
    eager = [t.clone().requires_grad_() for t in (x, w, b, r)]
    block(*eager).square().sum().backward()
    for c, e in zip(leaves, eager):
        torch.testing.assert_close(c.grad, e.grad, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
    full = rand((B, S, N), torch.float32, device)
    before = full.clone()
    fn = torch.compile(lambda x, w, r: linear(x, w, residual=r, out=r), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert fn(x, w, full) is full
    _check(full, x, w, None, None, before)
    torch._dynamo.reset()


class _InterpretedTma(InterpreterBackend):
    """The interpreter with tensor descriptors on and a 3-SM device (as in test_matmul.py)."""

    def tensor_descriptors(self, device=None) -> bool:
        return True

    def compute_units(self, device=None) -> int:
        return 3


@pytest.mark.parametrize("cfg", [{}, {"PERSISTENT": True, "EPILOGUE_SUBTILE": True}], ids=["one tile each",
                                                                                            "persistent + subtile"])
def test_tma_kernel_adds_the_residual_in_the_interpreter(cfg):
    be = _InterpretedTma()
    if be.unavailable_reason():
        pytest.skip(be.unavailable_reason())
    M, Kd, Nd, dtype = 96, 32, 80, torch.float16
    x, w, b = rand((M, Kd), dtype, "cpu"), rand((Nd, Kd), dtype, "cpu"), rand((Nd,), dtype, "cpu")
    for r in (rand((M, Nd), dtype, "cpu"), rand((Nd,), dtype, "cpu"), rand((Nd, M), dtype, "cpu").t()):
        call = linear.check(x, w, b, "gelu", residual=r)
        with tuning.force({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 2, "TMA": True, **cfg}):
            plan = linear.make_plan(call, be)
        assert plan.tma is not None and plan.constexprs["RES"] == 1 and "residual" in plan.variant
        c = poisoned((M, Nd), dtype, "cpu")
        with Unchanged(x, w, b, r):
            plan.launch(call.a, call.b, c, call.bias, call.slope, (), call.residual)
        _check(c, x, w, b, "gelu", r)
