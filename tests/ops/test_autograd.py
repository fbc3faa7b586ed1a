"""Autograd of the ops (``ops/autograd.py``): gradients against PyTorch's on the same inputs.

Each test runs the xkernels op and the PyTorch composition it is defined by (in float64, on the
CPU) with the same upstream gradient, and compares every input's gradient; outputs must carry
``requires_grad`` exactly where PyTorch's would.
"""

from __future__ import annotations

import pytest
import torch

from helpers import Unchanged, assert_close, dot_scale, every_matmul_to_vendor, poisoned, rand
from xkernels.ops import add, broadcast, linear, matmul
from xkernels.ops.matmul import ACTIVATIONS, reference_linear


def _leaves(*values, dtype=None):
    """Leaf copies requiring grad (float tensors), in ``dtype`` if given; numbers pass through."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            t = v.detach().clone() if dtype is None else v.detach().cpu().to(dtype)
            out.append(t.requires_grad_(t.dtype.is_floating_point or t.dtype.is_complex))
        else:
            out.append(v)
    return out


def _compare_grads(fn, ref_fn, args, dtype, scale=1.0, per_term=0.0):
    """``fn(*args)`` against ``ref_fn`` on float64 copies: every gradient, for one random upstream
    gradient (rounded to the result dtype, so both see the same values). A gradient summed over
    broadcast dims adds ``per_term`` to the tolerance scale per summed term (each term rounded
    once in low precision before the sum, as PyTorch does)."""
    mine = _leaves(*args)
    ref = _leaves(*args, dtype=torch.float64)
    with Unchanged(*args):
        got = fn(*mine)
    want = ref_fn(*ref)
    assert got.requires_grad and got.shape == want.shape
    upstream = torch.randn(want.shape).to(got.dtype).double()  # the same values reach both
    got.backward(upstream.to(got.dtype).to(got.device))
    want.backward(upstream)
    for m, r in zip(mine, ref):
        if isinstance(m, torch.Tensor) and m.requires_grad:
            assert m.grad is not None and m.grad.dtype == m.dtype and m.grad.shape == m.shape
            terms = got.numel() // max(1, m.numel())
            assert_close(m.grad, r.grad, m.dtype, scale=scale + per_term * terms)


BINARY = [  # (x shape, y shape or number, layout)
    ((5, 7), (7,), "bias[N]"),
    ((2, 3, 4, 5), (3, 1, 1), "per-channel (C,1,1)"),
    ((2, 3, 6, 6), (2, 1, 1, 6), "mask [B,1,1,S]"),
    ((4, 6), (1,), "single element"),
    ((4, 6), (), "0-d"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("sx,sy,layout", BINARY, ids=[b[2] for b in BINARY])
def test_broadcast_gradients(backend, device, dtype, sx, sy, layout):
    x, bias = rand(sx, dtype, device), rand(sy, dtype, device)
    _compare_grads(broadcast, torch.add, (x, bias), dtype, per_term=1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("alpha", [1, 2.5, -3], ids=str)
def test_add_gradients(backend, device, dtype, alpha):
    for sx, sy in (((5, 1, 7), (1, 3, 7)), ((6, 9), (9,)), ((), (4, 3))):
        x, y = rand(sx, dtype, device), rand(sy, dtype, device)
        _compare_grads(lambda x, y: add(x, y, alpha=alpha), lambda x, y: torch.add(x, y, alpha=alpha), (x, y), dtype,
                       per_term=abs(alpha))


def test_add_scalars_promotion_and_partial_grads(backend, device):
    x = rand((4, 9), torch.float16, device)
    _compare_grads(lambda x: add(x, 2.5, alpha=3), lambda x: torch.add(x, 2.5, alpha=3), (x,), torch.float16)
    _compare_grads(lambda x: add(1.5, x, alpha=-2), lambda x: torch.add(torch.tensor(1.5, dtype=x.dtype), x, alpha=-2),
                   (x,), torch.float16)
    # fp16 + fp32 -> fp32: each gradient comes back in its operand's dtype
    y = rand((9,), torch.float32, device)
    _compare_grads(add, torch.add, (x, y), torch.float32)
    # only one side requires grad; an int operand never does
    xl = rand((4, 9), torch.float32, device).requires_grad_()
    yi = rand((4, 9), torch.int32, device)
    got = add(xl, yi, alpha=2)
    assert got.requires_grad and got.dtype == torch.float32
    got.sum().backward()
    assert torch.equal(xl.grad, torch.ones_like(xl))


MATMUL = [
    ((6, 9), (9, 5)),
    ((9,), (9,)),                  # dot
    ((9,), (9, 5)),                # 1-D @ 2-D
    ((6, 9), (9,)),                # 2-D @ 1-D
    ((3, 6, 9), (3, 9, 5)),        # batched
    ((2, 1, 6, 9), (3, 9, 5)),     # broadcast batch dims
    ((2, 3, 6, 9), (9, 5)),        # batched @ 2-D
    ((6, 9), (2, 9, 5)),           # 2-D @ batched
    ((4, 0), (0, 3)),              # K = 0
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("sa,sb", MATMUL, ids=str)
def test_matmul_gradients(backend, device, dtype, sa, sb):
    a, b = rand(sa, dtype, device), rand(sb, dtype, device)
    _compare_grads(matmul, torch.matmul, (a, b), dtype, scale=4.0)


def _near_zero_inputs(dtype, device, m=6, k=8, n=10):
    """x, weight, bias whose pre-activations include exact zeros (a zero row of x with zero bias
    entries) and values within +-1e-3 of 0, besides ordinary ones."""
    x, w, b = rand((m, k), dtype, device), rand((n, k), dtype, device), rand((n,), dtype, device)
    x[0] = 0
    b[:3] = 0
    b[3] = 1e-3
    b[4] = -1e-3
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", list(ACTIVATIONS), ids=str)
def test_linear_gradients(backend, device, dtype, activation):
    x, w, b = _near_zero_inputs(dtype, device)
    _compare_grads(lambda x, w, b: linear(x, w, b, activation), lambda x, w, b: reference_linear(x, w, b, activation),
                   (x, w, b), dtype, scale=4.0 * _slope(activation, x, w, b))
    x3 = rand((2, 3, 8), dtype, device)  # batched x, no bias
    _compare_grads(lambda x, w: linear(x, w, None, activation), lambda x, w: reference_linear(x, w, None, activation),
                   (x3, w), dtype, scale=4.0 * _slope(activation, x3, w, None))


def _slope(activation, x, w, b):
    """The activation's largest slope over these inputs where it exceeds 1: relu2's, 2 relu(h), grows
    with the pre-activation h, and a low-precision gradient's rounding with it (PyTorch's own bf16
    composition is off from float64 by that much); so does quick_gelu's composed derivative's
    rounding (its term grad * h); the others' (<= 1.13) is in the tests' scale."""
    if activation not in ("relu2", "quick_gelu"):
        return 1.0
    h = torch.nn.functional.linear(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu())
    if activation == "quick_gelu":  # PyTorch's derivative rounds grad * h in the dtype: an error growing with |h|
        return max(1.0, 0.5 * h.abs().max().item())
    return max(1.0, 2 * h.clamp(min=0).max().item())


@pytest.mark.parametrize("slope", [0.2, 0.0, -0.5], ids=str)
def test_leaky_relu_slopes(backend, device, slope):
    x, w, b = _near_zero_inputs(torch.float32, device)
    _compare_grads(lambda x, w, b: linear(x, w, bias=b, activation="leaky_relu", negative_slope=slope),
                   lambda x, w, b: reference_linear(x, w, b, "leaky_relu", slope), (x, w, b), torch.float32, scale=4.0)


def test_relu2_reads_its_derivative_off_the_output(backend, device):
    """relu2's derivative, 2 relu(h), is 2 sqrt(y): where the call runs a kernel, one fused call
    keeps its output and nothing else (no pre-activation kernel, no PyTorch activation nodes), and
    first and second derivatives equal float64's; the second recomputes h. A change in place to
    the kept output then fails the backward loudly (PyTorch's relu, which keeps its result too,
    does the same; its square(relu(h)) keeps relu(h) instead)."""
    x, w, b = _near_zero_inputs(torch.float32, device)
    y = linear(*_leaves(x, w, b), "relu2")
    if backend.runs_triton:
        assert type(y.grad_fn).__name__ == "LinearFunctionBackward", type(y.grad_fn)
        kept = [t for t in y.grad_fn.saved_tensors if t is not None]
        assert len(kept) == 4 and kept[3].shape == y.shape and torch.equal(kept[3], y.detach())
    _compare_grads(lambda x, w, b: linear(x, w, b, "relu2"), lambda x, w, b: reference_linear(x, w, b, "relu2"),
                   (x, w, b), torch.float32, scale=4.0 * _slope("relu2", x, w, b))
    mine, ref = _leaves(x, w, b), _leaves(x, w, b, dtype=torch.float64)
    firsts = []
    for args, fn in ((mine, linear), (ref, reference_linear)):
        out = fn(*args, "relu2")
        gx, = torch.autograd.grad(out.square().sum(), args[0], create_graph=True)
        gx.sum().backward()  # d/d(w, b) of sum(d loss / dx): relu2's second derivative, 2 where h > 0
        firsts.append(gx)
    assert_close(firsts[0].detach(), firsts[1].detach(), torch.float32, scale=16.0 * _slope("relu2", x, w, b) ** 2)
    for m, r in zip(mine[1:], ref[1:]):
        assert_close(m.grad, r.grad, torch.float32, scale=16.0 * _slope("relu2", x, w, b) ** 2)
    if backend.runs_triton:
        y = linear(*_leaves(x, w, b), "relu2")
        y.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_requires_grad_only_where_torch_has_it(backend, device):
    x, y = rand((4, 5), torch.float32, device), rand((5,), torch.float32, device)
    assert not add(x, y).requires_grad
    xl = x.clone().requires_grad_()
    assert add(xl, y).requires_grad and broadcast(xl, y).requires_grad
    assert linear(x, rand((3, 5), torch.float32, device), bias=y[:3].clone().requires_grad_()).requires_grad
    with torch.no_grad():
        assert not add(xl, y).requires_grad
    with torch.inference_mode():
        assert not matmul(xl, y).requires_grad


def test_out_with_a_gradient_raises_before_writing(backend, device):
    x = rand((4, 5), torch.float32, device).requires_grad_()
    w = rand((3, 5), torch.float32, device)
    for call, shape in ((lambda o: add(x, x, out=o), (4, 5)), (lambda o: broadcast(x, x[0], out=o), (4, 5)),
                        (lambda o: matmul(x, w.t(), out=o), (4, 3)), (lambda o: linear(x, w, out=o), (4, 3))):
        out = poisoned(shape, torch.float32, device)
        with pytest.raises(ValueError, match="'out=' does not support autograd"):
            call(out)
        assert torch.isnan(out).all()
    with torch.no_grad():  # without a gradient out= works as before
        out = poisoned((4, 3), torch.float32, device)
        assert linear(x, w, out=out) is out and not torch.isnan(out).any()


def test_backward_gemms_run_through_xkernels_matmul(backend, device, monkeypatch):
    calls = []
    real = matmul._full_path

    def counted(args, kwargs):
        calls.append(tuple(a.shape for a in args))
        return real(args, kwargs)

    matmul._forget()  # no hot entries: every signature's first call takes the full path
    monkeypatch.setattr(matmul, "_full_path", counted)
    x = rand((6, 8), torch.float32, device).requires_grad_()
    w = rand((4, 8), torch.float32, device).requires_grad_()
    linear(x, w, None, "relu").sum().backward()
    assert sorted(calls) == [((4, 6), (6, 8)), ((6, 4), (4, 8))]  # grad_w = g^T x, grad_x = g w


def test_float64_gradcheck_and_double_backward(backend, device):
    """PyTorch's numerical gradient check of every formula (float64 runs PyTorch's kernels, so
    this checks the derivatives, not rounding), and second derivatives through the ops."""
    dd = dict(dtype=torch.float64, device=device)
    a, b = torch.randn(2, 3, 4, **dd, requires_grad=True), torch.randn(4, 2, **dd, requires_grad=True)
    assert torch.autograd.gradcheck(matmul, (a, b))
    assert torch.autograd.gradcheck(lambda a, y: add(a, y, alpha=-1.5), (a, torch.randn(4, **dd, requires_grad=True)))
    w, bias = torch.randn(3, 4, **dd, requires_grad=True), torch.randn(3, **dd, requires_grad=True)
    for act in ACTIVATIONS:
        assert torch.autograd.gradcheck(lambda x, w, b: linear(x, w, b, act), (a, w, bias))
    assert torch.autograd.gradgradcheck(lambda x, w, b: linear(x, w, b, "gelu"), (a, w, bias))


def test_vendor_signatures_record_torchs_own_autograd(backend, device, monkeypatch):
    """Where a signature's plan is the vendor BLAS (its hot entry computes with PyTorch ops), a
    call that needs a gradient runs that entry and autograd records torch's ops: aten's
    backward, no Python ``autograd.Function``. The first call, which plans, still goes through
    the Function. Gradients equal PyTorch's either way, and leaky_relu's slope is each call's own."""
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no kernel selection")
    with every_matmul_to_vendor(monkeypatch):
        shapes = ((2, 5, 8), (6, 8), (6,))
        first = linear(*_leaves(*(rand(s, torch.float32, device) for s in shapes)), "leaky_relu")
        assert type(first.grad_fn).__name__ == "LinearFunctionBackward"
        for slope in (0.1, -0.3, 0.2):
            x, w, b = (rand(s, torch.float32, device) for s in shapes)
            fn = lambda x, w, b, s=slope: linear(x, w, b, "leaky_relu", negative_slope=s)  # noqa: E731
            ref = lambda x, w, b, s=slope: reference_linear(x, w, b, "leaky_relu", s)  # noqa: E731
            assert type(fn(*_leaves(x, w, b)).grad_fn).__name__ == "LeakyReluBackward0"
            _compare_grads(fn, ref, (x, w, b), torch.float32, scale=4)
        a, m = rand((7, 8), torch.float32, device), rand((8, 3), torch.float32, device)
        matmul(*_leaves(a, m))  # plans
        assert type(matmul(*_leaves(a, m)).grad_fn).__name__ == "MmBackward0"
        _compare_grads(matmul, torch.matmul, (a, m), torch.float32, scale=4)


def _in_place_cases(angles, angles64):
    """name -> (shapes of the inputs that require grad, xkernels, PyTorch in float64); ``angles``:
    the rotary embedding's (cos, sin) on the device, ``angles64`` in float64 on the CPU."""
    import torch.nn.functional as F

    from xkernels.ops import add_layer_norm, add_rms_norm, gated_linear, rotary_embedding

    def rms(s, w):
        return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def rotate(t, cos, sin):
        h = t.shape[-1] // 2
        return t * cos[:, None] + torch.cat((-t[..., h:], t[..., :h]), -1) * sin[:, None]

    return {
        "linear 2-D": ([(6, 16), (8, 16), (8,)], lambda x, w, b: linear(x, w, b), F.linear),
        "linear 3-D, gelu": ([(2, 5, 16), (8, 16), (8,)], lambda x, w, b: linear(x, w, b, "gelu"),
                             lambda x, w, b: F.gelu(F.linear(x, w, b))),
        "matmul": ([(2, 5, 16), (16, 8)], matmul, torch.matmul),
        "add": ([(2, 5, 16), (5, 16)], add, torch.add),
        "broadcast": ([(2, 5, 16), (16,)], broadcast, torch.add),
        "gated_linear": ([(2, 5, 16), (8, 16), (8, 16)], lambda x, g, u: gated_linear(x, g, u),
                         lambda x, g, u: F.silu(F.linear(x, g)) * F.linear(x, u)),
        # the sum is saved for the norm's backward (PyTorch's norm saves its input too): the output only
        "add_rms_norm": ([(2, 5, 16), (2, 5, 16), (16,)], lambda x, r, w: add_rms_norm(x, r, w)[0],
                         lambda x, r, w: rms(x + r, w)),
        "add_layer_norm": ([(2, 5, 16), (2, 5, 16), (16,), (16,)], lambda x, r, w, b: add_layer_norm(x, r, w, b)[0],
                           lambda x, r, w, b: F.layer_norm(x + r, (16,), w, b)),
        "rotary_embedding": ([(2, 4, 5, 8), (2, 2, 5, 8)],
                             lambda q, k: rotary_embedding(q, k, *angles),
                             lambda q, k: (rotate(q, *angles64), rotate(k, *angles64))),
    }


@pytest.mark.parametrize("case", ["linear 2-D", "linear 3-D, gelu", "matmul", "add", "broadcast", "gated_linear",
                                  "add_rms_norm", "add_layer_norm", "rotary_embedding"])
def test_results_change_in_place_as_pytorchs(backend, device, case):
    """A result that needs a gradient may be changed in place, as PyTorch's op's may (Llama 4's
    MoE adds the routed experts into its shared expert's output with ``add_``; Gemma 3n scales a
    projection with ``*=``): the backward differentiates the change, with PyTorch's gradients. A
    kernel's result is a view of the buffer it wrote, which autograd refuses to change in place
    when a custom Function returns it (``ops/autograd.py``'s ``owned``)."""
    f = torch.randn(2, 5, 4)
    f = torch.cat((f, f), -1)
    angles, angles64 = (f.cos().to(device), f.sin().to(device)), (f.cos().double(), f.sin().double())
    shapes, fn, ref_fn = _in_place_cases(angles, angles64)[case]
    for _ in range(2):  # a first call and a repeat (its signature's route, a native node where one exists)
        inputs = [rand(s, torch.float32, device) for s in shapes]
        mine = _leaves(*inputs)
        ref = _leaves(*inputs, dtype=torch.float64)
        got, want = fn(*mine), ref_fn(*ref)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        ups = [rand(w.shape, torch.float32, device) for w in want]
        for g, w in zip(got, want):
            assert g.requires_grad
            g.mul_(3.0).add_(1.0)
            w.mul_(3.0).add_(1.0)
        for g, w in zip(got, want):  # sums over the inputs' last dim (the GEMMs' K)
            assert_close(g, w, torch.float32, scale=4.0 * dot_scale(shapes[0][-1]))
        sum((g * u).sum() for g, u in zip(got, ups)).backward()
        sum((w * u.cpu().double()).sum() for w, u in zip(want, ups)).backward()
        for m, r in zip(mine, ref):
            assert_close(m.grad, r.grad, torch.float32, scale=16.0)
