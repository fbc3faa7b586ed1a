"""add_layer_norm / add_rms_norm (ops/fused): the residual add fused with the norm after it, on
every test backend, against float64 PyTorch; gradients against torch's autograd; compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xkernels
from helpers import TOL, Unchanged, assert_close, rand
from xkernels import tuning
from xkernels.ops import add_layer_norm, add_rms_norm
from xkernels.ops.fused import add_norm_plan

KERNEL_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def reference(kind, x, residual, weight=None, bias=None, eps=1e-5, offset=0.0):
    """(y, s) in float64 from s rounded to its dtype, as torch's ``x + residual`` gives it."""
    s = x if residual is None else x + residual
    sd = s.double()
    n = s.shape[-1]
    wd = None if weight is None else weight.double()
    if kind == "layer":
        y = F.layer_norm(sd, (n,), wd, None if bias is None else bias.double(), eps)
    else:
        y = sd * torch.rsqrt(sd.square().mean(-1, keepdim=True) + eps)
        if wd is not None:
            y = y * (offset + wd)
    return y, s


def call(kind, x, residual, weight=None, bias=None, eps=None, offset=0.0, **kw):
    if kind == "layer":
        return add_layer_norm(x, residual, weight, bias, 1e-5 if eps is None else eps, **kw)
    return add_rms_norm(x, residual, weight, 1e-6 if eps is None else eps, offset=offset, **kw)


def check(kind, x, residual, weight=None, bias=None, offset=0.0, scale=2.0):
    with Unchanged(x, residual, weight, bias):
        y, s = call(kind, x, residual, weight, bias, offset=offset)
    eps = 1e-5 if kind == "layer" else 1e-6
    y_ref, s_ref = reference(kind, x, residual, weight, bias, eps, offset)
    assert s.shape == x.shape and s.dtype == s_ref.dtype and s.is_contiguous()
    assert torch.equal(s.cpu(), s_ref.cpu()), "s differs from torch's x + residual"
    # y is rounded once (fp16/bf16) or carries fp32 reduction error; weights (randn) scale it
    assert_close(y, y_ref, s_ref.dtype, scale=scale)


@pytest.fixture
def poison(monkeypatch):
    """Every result the kernel allocates starts as NaN: an element it does not write shows."""
    def nan_empty(shape, dtype, device):
        return torch.full(shape if isinstance(shape, tuple | torch.Size) else (shape,), float("nan"), dtype=dtype,
                          device=device)
    monkeypatch.setattr(add_norm_plan, "_empty", nan_empty)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_forward(backend, device, poison, kind, dtype):
    x, r = rand((3, 5, 40), dtype, device), rand((3, 5, 40), dtype, device)
    w, b = rand((40,), dtype, device), rand((40,), dtype, device)
    check(kind, x, r, w, b if kind == "layer" else None, offset=1.0 if kind == "rms" else 0.0)
    check(kind, x, r)                      # no weight, no bias
    check(kind, x, None, w)                # no residual: s = x
    if kind == "layer":
        check(kind, x, r, None, b)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_chunked_and_odd_n(backend, device, poison, kind):
    """N = 50 with 16-column chunks (a partial last chunk), 2 rows per program over 7 rows: the
    chunked path, masked rows and, on interpreter-npu, the persistent loop."""
    x, r, w = rand((7, 50), torch.float32, device), rand((7, 50), torch.float32, device), rand((50,), torch.float32,
                                                                                              device)
    x = x + 3.0  # a mean far from 0: the chunk merge must not cancel
    b = rand((50,), torch.float32, device) if kind == "layer" else None
    with tuning.force({"BLOCK_N": 16, "BLOCK_M": 2}):
        check(kind, x, r, w, b)
        if backend.runs_triton:
            assert "chunked" in (add_layer_norm if kind == "layer" else add_rms_norm).explain(x, r, w).variant
    check(kind, rand((3, 1000), torch.bfloat16, device), rand((3, 1000), torch.bfloat16, device),
          rand((1000,), torch.bfloat16, device))


def test_return_sum_false_and_eps(backend, device, poison):
    x, r, w = rand((4, 33), torch.float16, device), rand((4, 33), torch.float16, device), rand((33,), torch.float16,
                                                                                               device)
    y = add_layer_norm(x, r, w, None, 1e-3, return_sum=False)
    assert isinstance(y, torch.Tensor)
    assert_close(y, reference("layer", x, r, w, None, 1e-3)[0], torch.float16, scale=2)
    y = add_rms_norm(x, r, w, 0.1, offset=1.0, return_sum=False)
    assert_close(y, reference("rms", x, r, w, None, 0.1, 1.0)[0], torch.float16, scale=2)


def test_layouts(backend, device, poison):
    """Non-contiguous x (transposed, step-sliced last dim, row-sliced), residual broadcast as (N,)
    (read in place, row stride 0) and as (1, S, N) over a batch (copied), expanded residual."""
    base = rand((24, 6), torch.float32, device)
    xt = base.t()                                     # (6, 24), column stride 6: copied
    check("layer", xt, rand((6, 24), torch.float32, device), rand((24,), torch.float32, device))
    xs = rand((5, 48), torch.float32, device)[:, ::2]  # last dim strided: copied
    check("rms", xs, rand((5, 24), torch.float32, device), rand((24,), torch.float32, device))
    xr = rand((10, 24), torch.float32, device)[::2]   # row stride 48: read in place
    check("layer", xr, rand((24,), torch.float32, device))
    x3 = rand((2, 3, 24), torch.float32, device)
    check("rms", x3, rand((1, 3, 24), torch.float32, device))
    check("layer", x3, rand((1, 1, 24), torch.float32, device).expand(2, 3, 24))
    if backend.runs_triton:
        assert add_layer_norm.explain(xr, rand((24,), torch.float32, device)).why.count("copied") == 0
        assert "'x' copied" in add_layer_norm.explain(xs, None).why


def test_promotion_and_fallback(backend, device):
    h, f = rand((4, 24), torch.float16, device), rand((4, 24), torch.float32, device)
    w = rand((24,), torch.bfloat16, device)
    y, s = add_layer_norm(h, f, w)
    assert s.dtype == y.dtype == torch.float32
    check("layer", h, f, w)
    for kind in ("layer", "rms"):  # float64 runs PyTorch on every backend
        x, r = rand((3, 17), torch.float64, device), rand((3, 17), torch.float64, device)
        w = rand((17,), torch.float64, device)
        y, s = call(kind, x, r, w)
        y_ref, s_ref = reference(kind, x, r, w, eps=1e-5 if kind == "layer" else 1e-6)
        torch.testing.assert_close(y, y_ref)
        assert torch.equal(s, s_ref)
        expl = (add_layer_norm if kind == "layer" else add_rms_norm).explain(x, r, w)
        assert expl.route == "torch"


def test_empty(backend, device):
    y, s = add_layer_norm(torch.empty(0, 8, device=device), torch.empty(0, 8, device=device))
    assert y.shape == s.shape == (0, 8)


def test_bad_input(backend, device):
    x = rand((4, 6), torch.float32, device)
    r = rand((4, 6), torch.float32, device)
    with Unchanged(x, r):
        with pytest.raises(ValueError, match=r"'residual' of shape \(3, 4, 6\) would grow 'x' of shape \(4, 6\)"):
            add_layer_norm(x, rand((3, 4, 6), torch.float32, device))
        with pytest.raises(ValueError, match=r"shapes do not broadcast: 'x' \(4, 6\), 'residual' \(4, 5\)"):
            add_rms_norm(x, rand((4, 5), torch.float32, device))
        with pytest.raises(ValueError, match=r"'weight' has shape \(5,\), expected \(6,\)"):
            add_layer_norm(x, r, rand((5,), torch.float32, device))
        with pytest.raises(ValueError, match=r"'bias' has shape \(6, 1\), expected \(6,\)"):
            add_layer_norm(x, r, None, rand((6, 1), torch.float32, device))
        with pytest.raises(TypeError, match="'residual' has dtype torch.int32"):
            add_layer_norm(x, torch.ones(4, 6, dtype=torch.int32, device=device))
        with pytest.raises(TypeError, match="argument 'x' must be a torch.Tensor, got list"):
            add_rms_norm([1.0], r)
        with pytest.raises(TypeError, match="'eps' must be a real number, got str"):
            add_layer_norm(x, r, None, None, "1e-5")
        with pytest.raises(TypeError, match="'return_sum' must be a bool"):
            add_rms_norm(x, r, return_sum=1)
        with pytest.raises(ValueError, match="'offset' 1.0 scales .offset \\+ weight., but 'weight' is None"):
            add_rms_norm(x, r, offset=1.0)
        with pytest.raises(ValueError, match=r"tensors must be on one device, got 'x' on .*, 'weight' on meta"):
            add_rms_norm(x, r, torch.empty(6, device="meta"))
        with pytest.raises(ValueError, match="'x' is 0-d"):
            add_layer_norm(torch.tensor(1.0, device=device), None)


# -- gradients ----------------------------------------------------------------------------------
def _grads(fn, tensors, weights):
    for t in tensors:
        if t is not None:
            t.grad = None
    y, s = fn(*tensors)
    ((y * weights[0]).sum() + (s * weights[1]).sum()).backward()
    return [None if t is None else t.grad for t in tensors]


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("residual_shape", [(3, 5, 24), (24,)], ids=["same", "broadcast"])
def test_gradients(backend, device, poison, kind, residual_shape):
    """Gradients of x, residual (summed over its broadcast dims), weight, bias, with the sum used
    downstream too, against torch's autograd of the unfused composition in float64."""
    x = rand((3, 5, 24), torch.float32, device)
    r, w = rand(residual_shape, torch.float32, device), rand((24,), torch.float32, device)
    b = rand((24,), torch.float32, device) if kind == "layer" else None
    gy, gs = rand((3, 5, 24), torch.float32, device), rand((3, 5, 24), torch.float32, device)

    def mine(x, r, w, b):
        return call(kind, x, r, w, b, offset=0.5 if kind == "rms" else 0.0)

    def ref(x, r, w, b):
        s = x + r
        if kind == "layer":
            return F.layer_norm(s, (24,), w, b, 1e-5), s
        return s * torch.rsqrt(s.square().mean(-1, keepdim=True) + 1e-6) * (0.5 + w), s

    leaves = [t.requires_grad_() if t is not None else None for t in (x, r, w, b)]
    got = _grads(mine, leaves, (gy, gs))
    wide = [t.detach().double().requires_grad_() if t is not None else None for t in leaves]
    want = _grads(ref, wide, (gy.double(), gs.double()))
    for g, wref, name in zip(got, want, ("x", "residual", "weight", "bias")):
        if wref is None:
            continue
        assert g is not None and g.shape == wref.shape and g.dtype == torch.float32, name
        torch.testing.assert_close(g.double(), wref, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_gradients_return_sum_false_half(backend, device):
    x, r = rand((4, 32), torch.bfloat16, device).requires_grad_(), rand((4, 32), torch.float32, device).requires_grad_()
    w = rand((32,), torch.bfloat16, device).requires_grad_()
    y = add_rms_norm(x, r, w, return_sum=False)
    assert y.requires_grad and y.dtype == torch.float32
    y.square().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and r.grad.dtype == torch.float32 and w.grad.dtype == torch.bfloat16
    xd, rd, wd = (t.detach().double().requires_grad_() for t in (x, r, w))
    s = xd + rd
    (s * torch.rsqrt(s.square().mean(-1, keepdim=True) + 1e-6) * wd).square().sum().backward()
    torch.testing.assert_close(r.grad.double(), rd.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad.double(), xd.grad, rtol=TOL[torch.bfloat16][0] * 2, atol=1e-2)
    torch.testing.assert_close(w.grad.double(), wd.grad, rtol=1e-2, atol=1e-2)


# -- torch.compile ------------------------------------------------------------------------------
@pytest.mark.parametrize("return_sum", [True, False])
def test_compile_fullgraph(backend, device, return_sum):
    torch._dynamo.reset()
    x, r = rand((2, 3, 16), torch.float32, device), rand((2, 3, 16), torch.float32, device)
    w, b = rand((16,), torch.float32, device), rand((16,), torch.float32, device)

    def block(x, r, w, b):
        out = add_layer_norm(x, r, w, b, return_sum=return_sum)
        y, s = out if return_sum else (out, x + r)
        y2, s2 = add_rms_norm(y, s, w, offset=1.0)
        return (y2 * 2 + s2).sum(-1)

    leaves = [t.requires_grad_() for t in (x, r, w, b)]
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got = compiled(*leaves)
    got.sum().backward()
    got_grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    want = block(*leaves)
    want.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, e in zip(got_grads, (t.grad for t in leaves)):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()


def test_custom_op_fake_and_registration():
    assert hasattr(torch.ops.xkernels, "add_layer_norm") and hasattr(torch.ops.xkernels, "add_rms_norm")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 7, 8, dtype=torch.bfloat16)
        y, s, mean, rstd = torch.ops.xkernels.add_layer_norm(x, torch.empty(8, dtype=torch.float32), None, None,
                                                             1e-5, False)
        assert y.shape == (2, 7, 8) and y.dtype == torch.float32 and s.shape == (0,)
        assert mean.shape == rstd.shape == (14,) and rstd.dtype == torch.float32
        with pytest.raises(ValueError, match="'weight' has shape"):
            torch.ops.xkernels.add_rms_norm(x, None, torch.empty(3), 1e-6, 0.0, True)


def test_explain_and_exports():
    assert xkernels.ops.add_layer_norm is add_layer_norm and "add_rms_norm" in xkernels.ops.__all__
    x = torch.randn(4, 768)
    with xkernels.use_backend("interpreter"):
        e = add_layer_norm.explain(x, x, torch.randn(768), torch.randn(768))
    assert e.route == "triton kernel" and e.config["BLOCK_N"] >= 768 and "LayerNorm" in e.why
    with xkernels.use_backend("cpu"):
        assert add_rms_norm.explain(x, x).route == "torch"
