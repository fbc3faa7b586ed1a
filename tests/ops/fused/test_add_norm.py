"""add_layer_norm / add_rms_norm (ops/fused): the residual add fused with the norm after it, on
every test backend, against float64 PyTorch; gradients against torch's autograd; compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xkernels
from helpers import TOL, CheckCounter, Unchanged, assert_close, rand
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


# -- the fused backward -------------------------------------------------------------------------
#: relative tolerance of a gradient against the float64 one, scaled by the gradient's largest
#: magnitude: one rounding to the dtype plus fp32 sums
GRAD_RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5}


class BackwardSpy:
    """Counts backwards that ran the Triton kernel (``add_norm_bwd.backward``)."""

    def __init__(self, monkeypatch):
        from xkernels.ops.fused import add_norm_bwd

        self.n = 0
        real = add_norm_bwd.backward

        def counted(*args, **kwargs):
            self.n += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(add_norm_bwd, "backward", counted)


def reference_grads(kind, x, r, w, b, dy, ds, eps, offset):
    """Float64 autograd of torch's composition from the sum rounded to its dtype (what the forward
    normalized): d(x), d(residual) (summed over its broadcast dims), d(w), d(b)."""
    s = (x if r is None else x + r).detach()
    sd = s.double().requires_grad_()
    wd = None if w is None else w.detach().double().requires_grad_()
    bd = None if b is None else b.detach().double().requires_grad_()
    n = s.shape[-1]
    if kind == "layer":
        y = F.layer_norm(sd, (n,), wd, bd, eps)
    else:
        y = sd * torch.rsqrt(sd.square().mean(-1, keepdim=True) + eps)
        y = y if wd is None else y * (offset + wd)
    loss = (y * dy.double()).sum() + (0 if ds is None else (sd * ds.double()).sum())
    loss.backward()
    g = sd.grad
    return g, None if r is None else g.sum_to_size(r.shape), None if w is None else wd.grad, \
        None if b is None else bd.grad


def run_backward(kind, x, r, w, b, dy, ds, eps, offset, return_sum):
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (x, r, w, b)]
    lx, lr, lw, lb = leaves
    if kind == "layer":
        out = add_layer_norm(lx, lr, lw, lb, eps, return_sum=return_sum)
    else:
        out = add_rms_norm(lx, lr, lw, eps, offset=offset, return_sum=return_sum)
    y, s = out if return_sum else (out, None)
    loss = (y * dy).sum() + (0 if ds is None else (s * ds).sum())
    loss.backward()
    return [None if t is None else t.grad for t in leaves]


def check_backward(kind, x, r, w, b, eps=1e-5, offset=0.0, return_sum=True, with_ds=True):
    s_dtype = x.dtype if r is None else torch.result_type(x, r)
    dy = rand(x.shape, s_dtype, x.device)
    ds = rand(x.shape, s_dtype, x.device) if return_sum and with_ds else None
    with Unchanged(x, r, w, b, dy, ds):
        got = run_backward(kind, x, r, w, b, dy, ds, eps, offset, return_sum)
    want = reference_grads(kind, x, r, w, b, dy, ds, eps, offset)
    for g, e, t, name in zip(got, want, (x, r, w, b), ("x", "residual", "weight", "bias")):
        if t is None:
            continue
        assert g is not None and g.shape == t.shape and g.dtype == t.dtype, name
        gd, ed = g.detach().cpu().double(), e.cpu()
        assert not torch.isnan(gd).any(), f"{name}: NaN in the gradient (an element not written?)"
        rtol = max(GRAD_RTOL[t.dtype], GRAD_RTOL[s_dtype])
        torch.testing.assert_close(gd, ed, rtol=rtol, atol=rtol * ed.abs().max().item(),
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_backward_kernel(backend, device, poison, monkeypatch, kind, dtype):
    """The fused backward against float64 autograd: with/without residual, weight, bias, the
    returned sum (and its gradient), an RMSNorm offset; the kernel on Triton backends."""
    spy = BackwardSpy(monkeypatch)
    x, r = rand((3, 5, 24), dtype, device), rand((3, 5, 24), dtype, device)
    w, b = rand((24,), dtype, device), rand((24,), dtype, device) if kind == "layer" else None
    eps = 1e-5 if kind == "layer" else 1e-6
    calls = [dict(r=r, w=w, b=b), dict(r=r, w=w, b=b, with_ds=False), dict(r=None, w=w, b=b),
             dict(r=r, w=None, b=None), dict(r=r, w=w, b=b, return_sum=False)]
    if kind == "rms":
        calls.append(dict(r=r, w=w, b=None, offset=1.0))
    else:
        calls.append(dict(r=r, w=None, b=b))
    for c in calls:
        check_backward(kind, x, c["r"], c["w"], c["b"], eps, c.get("offset", 0.0), c.get("return_sum", True),
                       c.get("with_ds", True))
    assert spy.n == (len(calls) if backend.runs_triton else 0)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_backward_chunked_broadcast_promoted(backend, device, poison, monkeypatch, kind):
    """Rows longer than BLOCK_N (two passes, atomically added d(w)/d(b) partials, a persistent
    loop over 7 rows in tiles of 2), a residual broadcast as (N,) and as (1, S, N), and an fp16 x
    with an fp32 residual (d(x) and d(residual) written in their own dtypes)."""
    spy = BackwardSpy(monkeypatch)
    f32 = torch.float32
    x, w = rand((7, 50), f32, device) + 3.0, rand((50,), f32, device)
    b = rand((50,), f32, device) if kind == "layer" else None
    with tuning.force({"BLOCK_N": 16, "BLOCK_M": 2}):
        check_backward(kind, x, rand((7, 50), f32, device), w, b)
        check_backward(kind, x, rand((50,), f32, device), w, b)
    x3 = rand((2, 3, 24), torch.float16, device)
    check_backward(kind, x3, rand((1, 3, 24), f32, device), rand((24,), f32, device), None)
    check_backward(kind, x3, rand((2, 3, 24), f32, device), rand((24,), torch.bfloat16, device), None)
    assert spy.n == (4 if backend.runs_triton else 0)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_backward_parameter_sums(backend, device, poison, monkeypatch, kind):
    """d(w)/d(b) summed over many programs' partials (more than one step of the summing kernel's
    rows, columns past one program's block with a tail), and again with both kernels' grids
    capped at two programs (persistent loops), written in the parameters' own dtypes (fp32
    weight, bf16 bias over bf16 activations), against float64."""
    from xkernels.ops.fused import add_norm_bwd

    monkeypatch.setattr(add_norm_bwd, "SUM_ROWS", 4)
    monkeypatch.setattr(add_norm_bwd, "SUM_COLS", 16)
    spy = BackwardSpy(monkeypatch)
    bf = torch.bfloat16
    x, r = rand((37, 40), bf, device), rand((37, 40), bf, device)
    w = rand((40,), torch.float32, device)
    b = rand((40,), bf, device) if kind == "layer" else None
    for cap in (None, 2):
        if cap:
            monkeypatch.setattr(backend, "programs", lambda n, unit="vector", device=None: max(1, min(n, cap)))
        with tuning.force({"BLOCK_N": 64, "BLOCK_M": 2, "WAVES": 64 if cap is None else 1}):
            check_backward(kind, x, r, w, b)
            check_backward(kind, x, r, None if kind == "layer" else w, b, with_ds=False)
    assert spy.n == (4 if backend.runs_triton else 0)


def test_backward_only_some_inputs(backend, device, poison):
    """Gradients asked for some inputs only: the others stay None; a weight-only backward."""
    x, r, w = rand((4, 32), torch.bfloat16, device), rand((4, 32), torch.bfloat16, device), \
        rand((32,), torch.float32, device).requires_grad_()
    y, s = add_layer_norm(x, r, w)
    (y.float() * 2).sum().backward()
    s_ref = (x + r).double().requires_grad_()
    wd = w.detach().double().requires_grad_()
    (F.layer_norm(s_ref, (32,), wd) * 2).sum().backward()
    torch.testing.assert_close(w.grad.double(), wd.grad, rtol=1e-4, atol=1e-4)
    r = r.clone().requires_grad_()
    y, s = add_layer_norm(x, r, w.detach())
    (y.float().square().sum() + s.float().sum()).backward()
    assert r.grad is not None and r.grad.dtype == torch.bfloat16 and x.grad is None


def test_backward_route_flag(backend, device, monkeypatch, tmp_path):
    """``"backward": "torch"`` in a rule sends the backward to PyTorch's formula; an unknown
    value is a ValueError naming it."""
    from helpers import planted_tables

    spy = BackwardSpy(monkeypatch)
    rules = [{"when": {"pass": "backward"}, "config": {"backward": "torch"}}]
    with planted_tables(tmp_path / "t", backend.name, {"add_norm": {"archs": {
            "default": rules}}}):
        check_backward("layer", rand((4, 24), torch.float32, device), rand((4, 24), torch.float32, device),
                       rand((24,), torch.float32, device), rand((24,), torch.float32, device))
        assert spy.n == 0
        rules[0]["config"]["backward"] = "fused"
    if backend.runs_triton:
        with planted_tables(tmp_path / "u", backend.name, {"add_norm": {"archs": {
                "default": rules}}}):
            with pytest.raises(ValueError, match="\"backward\": 'fused'"):
                check_backward("layer", rand((4, 24), torch.float32, device), None, None, None)


def test_backward_route_looked_up_once(backend, device, monkeypatch):
    """A repeated backward of one signature does not walk the tuning tables again (each walk
    stats every tuning directory: ~0.6 ms per training step on an H100 host before)."""
    from xkernels.ops.fused import add_norm_bwd

    add_norm_bwd._routes.clear()
    walks = []
    real = tuning.lookup
    monkeypatch.setattr(tuning, "lookup", lambda op, *a, **k: (walks.append(op), real(op, *a, **k))[1])
    x, r = rand((4, 24), torch.float32, device), rand((4, 24), torch.float32, device)
    w, b = rand((24,), torch.float32, device), rand((24,), torch.float32, device)
    check_backward("layer", x, r, w, b)
    walks.clear()
    for _ in range(2):
        check_backward("layer", x, r, w, b)
    assert walks == []


# -- routes of repeated calls -------------------------------------------------------------------
@pytest.fixture
def fresh_routes():
    for op in (add_layer_norm, add_rms_norm):
        op._forget()
    yield
    for op in (add_layer_norm, add_rms_norm):
        op._forget()


@pytest.fixture
def poison_routes(monkeypatch):
    """Results a route allocates start as NaN too."""
    def nan_allocator(backend, device):
        def alloc(size, stride, dtype):
            return torch.full(size, float("nan"), dtype=dtype, device=device)
        return alloc
    monkeypatch.setattr(add_norm_plan, "allocator", nan_allocator)


def test_route_repeats_skip_checks_and_match(backend, device, poison, poison_routes, fresh_routes, monkeypatch):
    counter = CheckCounter(add_layer_norm, monkeypatch)
    dtype = torch.bfloat16
    w, b = rand((40,), dtype, device), rand((40,), dtype, device)
    for _ in range(3):  # fresh data, one signature
        x, r = rand((6, 40), dtype, device), rand((6, 40), dtype, device)
        check("layer", x, r, w, b)
    assert counter.n == (1 if backend.runs_triton else 3)
    if backend.runs_triton:
        assert add_layer_norm.repeat_route(x, r, w, b, 1e-5).kind == "triton kernel"


def test_route_never_reused_for_other_values(backend, device, poison, poison_routes, fresh_routes, monkeypatch):
    """Another eps, offset, return_sum, shape, stride or dtype: each result against torch."""
    counter = CheckCounter(add_rms_norm, monkeypatch)
    x, r, w = rand((5, 32), torch.float32, device), rand((5, 32), torch.float32, device), \
        rand((32,), torch.float32, device)
    calls = [((x, r, w, 1e-6), {}), ((x, r, w, 1e-6), {}), ((x, r, w, 0.5), {}), ((x, r, w, 0.5), {}),
             ((x, r, w, 1e-6), {"offset": 1.0}), ((x, r, w, 1e-6), {"offset": -0.0}),
             ((x, r, w, 1e-6), {"offset": 1.0}), ((x, r, w, 2), {}),
             ((x, r, w, 0.5), {"return_sum": False}), ((x[:4], r[:4], w, 0.5), {}),
             ((rand((10, 32), torch.float32, device)[::2], r, w, 0.5), {}),
             ((x.half(), r.half(), w, 0.5), {})]
    for args, kwargs in calls:
        xx, rr, ww, eps = args
        offset = kwargs.get("offset", 0.0)
        out = add_rms_norm(*args, **kwargs)
        y = out if kwargs.get("return_sum") is False else out[0]
        y_ref, s_ref = reference("rms", xx, rr, ww, None, eps, offset)
        assert_close(y, y_ref, s_ref.dtype, scale=2.0)
        if kwargs.get("return_sum") is not False:
            assert torch.equal(out[1], s_ref)
    with pytest.raises(ValueError, match="'offset' 1.0 scales"):
        add_rms_norm(x, r, None, 1e-6, offset=0.0)
        add_rms_norm(x, r, None, 1e-6, offset=1.0)  # the no-weight signature's route must not skip the check
    if backend.runs_triton:
        assert counter.n < len(calls) + 2  # some repeats were routed


def test_route_backward(backend, device, poison, poison_routes, fresh_routes, monkeypatch):
    """Repeated calls requiring grad: checked once, recorded by the autograd Function through the
    route, backward by the kernel, gradients against float64 each time (another eps too)."""
    counter = CheckCounter(add_layer_norm, monkeypatch)
    spy = BackwardSpy(monkeypatch)
    w, b = rand((24,), torch.float32, device), rand((24,), torch.float32, device)
    for eps in (1e-5, 1e-5, 1e-2):
        x, r = rand((4, 24), torch.float32, device), rand((24,), torch.float32, device)
        check_backward("layer", x, r, w, b, eps)
    if backend.runs_triton:
        assert counter.n == 1 and spy.n == 3


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_route_backward_repeats(backend, device, poison, poison_routes, fresh_routes, monkeypatch, kind):
    """A signature's repeated backwards (``add_norm_bwd.HotBackward``): the generic backward runs
    once per backward signature (the gradients' dtypes and strides, which inputs need one, the
    offset), repeats launch by the route's record; each result against float64 autograd, with
    every allocation poisoned: with and without the sum's gradient, a ``dy`` of rows 80 apart,
    some inputs only, another offset; a ``dy`` with a column stride takes the generic path."""
    spy = BackwardSpy(monkeypatch)
    dtype = torch.bfloat16
    w = rand((40,), dtype, device)
    b = rand((40,), dtype, device) if kind == "layer" else None
    eps = 1e-5 if kind == "layer" else 1e-6

    def once(with_ds=True, strided=False, grad_x=True, offset=0.0):
        x, r = rand((6, 40), dtype, device), rand((6, 40), dtype, device)
        dy = rand((6, 80), dtype, device)[:, ::2] if strided == "columns" else \
            rand((6, 80), dtype, device)[:, 8:48] if strided else rand((6, 40), dtype, device)  # rows 80 apart
        ds = rand((6, 40), dtype, device) if with_ds else None
        lx = x.clone().requires_grad_(grad_x)
        lr, lw = r.clone().requires_grad_(), w.clone().requires_grad_()
        lb = None if b is None else b.clone().requires_grad_()
        with Unchanged(x, r, w, dy, ds):
            if kind == "layer":
                y, s = add_layer_norm(lx, lr, lw, lb, eps)
            else:
                y, s = add_rms_norm(lx, lr, lw, eps, offset=offset)
            torch.autograd.backward((y, s) if with_ds else (y,), (dy, ds) if with_ds else (dy,))
        want = reference_grads(kind, x, r, w, b, dy, ds, eps, offset)
        for g, e, t, name in zip((lx.grad, lr.grad, lw.grad, None if lb is None else lb.grad), want,
                                 (lx, lr, lw, lb), ("x", "residual", "weight", "bias")):
            if t is None or not t.requires_grad:
                assert t is None or g is None, name
                continue
            assert g is not None and g.shape == t.shape and g.dtype == t.dtype, name
            gd = g.double().cpu()
            assert not torch.isnan(gd).any(), f"{name}: NaN in the gradient (an element not written?)"
            rtol = GRAD_RTOL[dtype]
            torch.testing.assert_close(gd, e.cpu(), rtol=rtol, atol=rtol * e.abs().max().item(),
                                       msg=lambda m, n=name: f"{n}: {m}")

    signatures = [dict(), dict(with_ds=False), dict(strided=True), dict(grad_x=False)]
    if kind == "rms":
        signatures.append(dict(offset=1.0))
    for sig in signatures:
        for _ in range(3):
            once(**sig)
    if backend.runs_triton:
        # the first call of the op takes the full path (its backward: the generic one), the first
        # backward of each signature through the route too; every other repeat by its record
        assert spy.n == 1 + len(signatures)
    n = spy.n
    for _ in range(2):
        once(strided="columns")
    if backend.runs_triton:
        assert spy.n == n + 2
