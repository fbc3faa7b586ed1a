"""rotary_embedding (ops/fused): transformers' apply_rotary_pos_emb, q and k in one launch, on every
test backend, against float64 PyTorch; gradients against torch's autograd; bad input; compile."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close, rand
from xkernels.ops import rotary_embedding
from xkernels.ops.fused import rotary
from xkernels.ops.fused.rotary import torch_rotary

KERNEL_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.fixture
def poison(monkeypatch):
    """Every result the kernel allocates starts as NaN: an element it does not write shows."""
    real = rotary._result
    monkeypatch.setattr(rotary, "_result", lambda x, full: real(x, full).fill_(float("nan")))


def hf_layout(b, s, h, d, dtype, device):
    """q / k as transformers hands them over: projected (b, s, h*d), viewed, transposed to (b, h, s, d)."""
    return rand((b, s, h * d), dtype, device).view(b, s, h, d).transpose(1, 2)


def angles(batch, s, r, dtype, device):
    """cos / sin as a rotary embedding module makes them: (batch, s, r), the halves repeated."""
    inv = 1.0 / (10000 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    pos = torch.arange(s, dtype=torch.float64)[None, :, None] + torch.randint(0, 50, (batch, 1, 1))
    f = pos * inv
    emb = torch.cat((f, f), dim=-1)
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


def same_layout(a, b):
    """The same strides along every dim longer than 1 (a size-1 dim's stride means nothing)."""
    return a.shape == b.shape and all(x == y for x, y, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def reference(q, k, cos, sin, u=1, interleaved=False):
    return torch_rotary(q.double(), k.double(), cos.double(), sin.double(), u, interleaved)


def check_call(q, k, cos, sin, u=1, interleaved=False):
    with Unchanged(q, k, cos, sin):
        qe, ke = rotary_embedding(q, k, cos, sin, u, interleaved=interleaved)
    rq, rk = reference(q, k, cos, sin, u, interleaved)
    assert_close(qe, rq, q.dtype, scale=2.0)
    assert_close(ke, rk, k.dtype, scale=2.0)
    return qe, ke


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("shape", [(2, 5, 4, 2, 16, 16), (1, 7, 3, 1, 32, 32), (2, 3, 2, 2, 24, 8),
                                   (1, 9, 4, 4, 20, 16)],
                         ids=["gqa", "mqa", "partial 8 of 24", "partial 16 of 20"])
def test_matches_transformers_formula(backend, device, poison, dtype, shape):
    b, s, h, hk, d, r = shape
    q, k = hf_layout(b, s, h, d, dtype, device), hf_layout(b, s, hk, d, dtype, device)
    cos, sin = angles(1, s, r, dtype, device)
    qe, ke = check_call(q, k, cos, sin)
    if r == d:  # the layout PyTorch's formula gives: q's (element-wise ops), contiguous (partial: torch.cat)
        assert same_layout(qe, q) and same_layout(ke, k), "a dense operand's layout is kept"
    else:
        assert qe.is_contiguous() and ke.is_contiguous()


def test_per_batch_angles_and_other_layouts(backend, device, poison):
    """cos / sin per batch row (position ids that differ per sequence), unsqueeze_dim=2 with q in
    (b, s, h, d), contiguous and NeoX's non-dense chunks of a fused qkv projection."""
    dt = torch.float32
    b, s, h, d = 3, 6, 2, 16
    cos, sin = angles(b, s, d, dt, device)
    check_call(hf_layout(b, s, h, d, dt, device), hf_layout(b, s, h, d, dt, device), cos, sin)
    q, k = rand((b, s, h, d), dt, device), rand((b, s, 1, d), dt, device)
    check_call(q, k, cos, sin, 2)
    qkv = rand((b, s, h, 3 * d), dt, device).transpose(1, 2)
    q, k, _ = qkv.chunk(3, dim=-1)
    qe, _ = check_call(q, k, cos[..., :8], sin[..., :8])
    assert qe.is_contiguous(), "a non-dense q gives a contiguous result, as torch.cat does"
    check_call(rand((h, s, d), dt, device), rand((h, s, d), dt, device), cos[0], sin[0], 0)  # 3-D q, cos (s, d)
    strided = rand((b, 1, d, s), dt, device).transpose(-1, -2)  # a strided last dim (copied first)
    qe, ke = check_call(hf_layout(b, s, h, d, dt, device), strided, cos, sin)
    assert ke.stride(-1) == 1 or not backend.runs_triton  # the kernel's copy; torch keeps k's layout
    check_gradients(strided, strided, cos, sin)


def test_cos_and_sin_with_different_halves(backend, device, poison):
    """Nothing assumes cos[..., :r/2] == cos[..., r/2:] (forward and backward)."""
    q, k = hf_layout(2, 4, 2, 16, torch.float32, device), hf_layout(2, 4, 1, 16, torch.float32, device)
    cos, sin = rand((2, 4, 16), torch.float32, device), rand((2, 4, 16), torch.float32, device)
    check_call(q, k, cos, sin)
    check_gradients(q, k, cos, sin)


def check_gradients(q, k, cos, sin, u=1, scale=4.0, interleaved=False):
    qq, kk = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    qe, ke = rotary_embedding(qq, kk, cos, sin, u, interleaved)
    assert type(qe.grad_fn).__name__ == "RotaryFunctionBackward"
    gq, gk = torch.randn_like(qe), torch.randn_like(ke)
    with Unchanged(gq, gk, cos, sin):
        torch.autograd.backward([qe, ke], [gq, gk])
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    rq, rk = torch_rotary(q64, k64, cos.double(), sin.double(), u, interleaved)
    torch.autograd.backward([rq, rk], [gq.double(), gk.double()])
    assert_close(qq.grad, q64.grad, q.dtype, scale=scale)
    assert_close(kk.grad, k64.grad, k.dtype, scale=scale)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("r", [16, 8], ids=["full", "partial"])
def test_gradients(backend, device, poison, dtype, r):
    q, k = hf_layout(2, 5, 4, 16, dtype, device), hf_layout(2, 5, 2, 16, dtype, device)
    cos, sin = angles(2, 5, r, dtype, device)
    check_gradients(q, k, cos, sin)


def test_one_output_used(backend, device):
    """Only q_embed reaches the loss: k's gradient is None, q's exact; a k not requiring grad
    gets none."""
    q, k = hf_layout(1, 4, 2, 16, torch.float32, device), hf_layout(1, 4, 2, 16, torch.float32, device)
    cos, sin = angles(1, 4, 16, torch.float32, device)
    qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
    qe, _ = rotary_embedding(qq, kk, cos, sin)
    qe.sum().backward()
    assert kk.grad is None
    q64 = q.double().requires_grad_()
    torch_rotary(q64, k.double(), cos.double(), sin.double())[0].sum().backward()
    assert_close(qq.grad, q64.grad, torch.float32, scale=4.0)
    qq.grad = None
    qe, ke = rotary_embedding(qq, k, cos, sin)
    assert qe.requires_grad and not ke.requires_grad, "k_embed requires grad only where k does, as in torch"
    qe.sum().backward()
    assert_close(qq.grad, q64.grad, torch.float32, scale=4.0)


def test_cos_requiring_grad_records_torch_formula(backend, device):
    """Gradients of cos / sin are kept (PyTorch's formula records them), never dropped."""
    q = hf_layout(1, 3, 2, 8, torch.float32, device)
    k = q.detach().clone()
    cos, sin = angles(1, 3, 8, q.dtype, device)
    cos.requires_grad_()
    qe, ke = rotary_embedding(q, k, cos, sin)
    assert qe.requires_grad and type(qe.grad_fn).__name__ != "RotaryFunctionBackward"
    (qe.sum() + ke.sum()).backward()
    c64 = cos.detach().double().requires_grad_()
    a, b = torch_rotary(q.double(), k.double(), c64, sin.double())
    (a.sum() + b.sum()).backward()
    torch.testing.assert_close(cos.grad.double(), c64.grad, rtol=1e-5, atol=1e-5)


def test_mixed_dtypes_follow_torch_promotion(backend, device):
    """bf16 q, k with fp32 cos / sin (a model under autocast): torch's formula, fp32 results."""
    q, k = hf_layout(1, 3, 2, 8, torch.bfloat16, device), hf_layout(1, 3, 2, 8, torch.bfloat16, device)
    cos, sin = angles(1, 3, 8, torch.float32, device)
    qe, ke = rotary_embedding(q, k, cos, sin)
    assert qe.dtype == torch.float32 and ke.dtype == torch.float32
    e = xkernels.ops.explain(rotary_embedding, q, k, cos, sin)
    assert e.route == "torch" and ("dtypes" in e.reason or not backend.runs_triton)
    rq, _ = reference(q, k, cos, sin)
    assert_close(qe, rq, torch.float32)


def test_explain_names_the_kernel(backend, device):
    q, k = hf_layout(1, 3, 2, 8, torch.float32, device), hf_layout(1, 3, 2, 8, torch.float32, device)
    cos, sin = angles(1, 3, 4, torch.float32, device)
    e = xkernels.ops.explain(rotary_embedding, q, k, cos, sin)
    if backend.runs_triton:
        assert e.route == "triton kernel" and "partial rotary: 4 of 8" in e.variant
    else:
        assert e.route == "torch"


@pytest.mark.parametrize("bad, err, words", [
    (lambda q, k, c, s: (q, k, c[..., :5], s[..., :5]), ValueError, "must be even"),
    (lambda q, k, c, s: (q, k, c, s[..., :4]), ValueError, "'sin'"),
    (lambda q, k, c, s: (q, k, torch.cat([c, c], -1), torch.cat([s, s], -1)), ValueError, "at most"),
    (lambda q, k, c, s: (q, k, c[..., :6].repeat(1, 2, 1), s[..., :6].repeat(1, 2, 1)), ValueError, "broadcast"),
    (lambda q, k, c, s: (q, k.to(torch.int32), c, s), TypeError, "'k' has dtype torch.int32"),
    (lambda q, k, c, s: (q, k, c, s, 1.0), TypeError, "'unsqueeze_dim'"),
    (lambda q, k, c, s: (q, k, c, s, 5), ValueError, "out of range"),
    (lambda q, k, c, s: (q, k, c, s, 1, 1), TypeError, "'interleaved' must be a bool"),
    (lambda q, k, c, s: (q, k.to("meta"), c, s), ValueError, "one device"),
    (lambda q, k, c, s: (q, "k", c, s), TypeError, "'k'"),
], ids=["odd rotary dim", "sin shape", "rotary wider than head", "cos grows q", "int k", "float unsqueeze_dim",
        "unsqueeze_dim range", "interleaved not a bool", "devices", "not a tensor"])
def test_bad_input_raises_before_any_kernel(backend, device, bad, err, words):
    q, k = hf_layout(1, 3, 2, 8, torch.float32, device), hf_layout(1, 3, 2, 8, torch.float32, device)
    cos, sin = angles(1, 3, 6, torch.float32, device)
    with pytest.raises(err, match=words.replace("(", r"\(").replace("[", r"\[")):
        rotary_embedding(*bad(q, k, cos, sin))


def test_compile_fullgraph(backend, device):
    """Under torch.compile the op traces PyTorch's formula (no graph break) and matches eager."""
    q, k = hf_layout(1, 4, 2, 16, torch.float32, device), hf_layout(1, 4, 1, 16, torch.float32, device)
    cos, sin = angles(1, 4, 16, torch.float32, device)
    fn = torch.compile(lambda *a: rotary_embedding(*a), fullgraph=True, backend="aot_eager")
    got = fn(q, k, cos, sin)
    rq, rk = reference(q, k, cos, sin)
    assert_close(got[0], rq, torch.float32)
    assert_close(got[1], rk, torch.float32)



# -- interleaved pairs (Cohere, GLM, Ernie 4.5, GPT-J) ------------------------------------------------
def pair_angles(batch, s, r, dtype, device):
    """cos / sin as the interleaved families make them: each pair's angle twice, side by side."""
    cos, sin = angles(batch, s, r, torch.float64, "cpu")
    return tuple(t[..., : r // 2].repeat_interleave(2, dim=-1).to(dtype).to(device) for t in (cos, sin))


def complex_rotation(x, cos, sin, u=1):
    """The interleaved rotation as complex multiplication, in float64: ``(x[2i] + j x[2i+1]) * e^(j angle)``."""
    r = cos.shape[-1]
    head = torch.view_as_complex(x[..., :r].double().unflatten(-1, (r // 2, 2)).contiguous())
    turn = torch.complex(cos[..., ::2].double(), sin[..., ::2].double()).unsqueeze(u)
    return torch.cat([torch.view_as_real(head * turn).flatten(-2), x[..., r:].double()], dim=-1)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("shape", [(2, 5, 4, 2, 16, 16), (1, 9, 4, 4, 20, 16), (2, 3, 2, 1, 24, 8)],
                         ids=["gqa", "partial 16 of 20", "partial 8 of 24"])
def test_interleaved_is_the_complex_rotation(backend, device, poison, dtype, shape):
    b, s, h, hk, d, r = shape
    q, k = hf_layout(b, s, h, d, dtype, device), hf_layout(b, s, hk, d, dtype, device)
    cos, sin = pair_angles(1, s, r, dtype, device)
    with Unchanged(q, k, cos, sin):
        qe, ke = rotary_embedding(q, k, cos, sin, interleaved=True)
    assert_close(qe, complex_rotation(q, cos, sin), dtype, scale=2.0)
    assert_close(ke, complex_rotation(k, cos, sin), dtype, scale=2.0)
    check_gradients(q, k, cos, sin, interleaved=True)
    if backend.runs_triton:
        assert "interleaved pairs" in xkernels.ops.explain(rotary_embedding, q, k, cos, sin, 1, True).variant


@pytest.mark.parametrize("pairs", ["split", "gather"])
def test_interleaved_pairs_either_way(backend, device, poison, pairs):
    """Both ways the kernel pairs adjacent columns (the table's PAIRS), forward and backward."""
    q, k = hf_layout(2, 5, 4, 16, torch.float32, device), hf_layout(2, 5, 2, 16, torch.float32, device)
    cos, sin = rand((1, 5, 12), torch.float32, device), rand((1, 5, 12), torch.float32, device)  # partial 12 of 16
    with xkernels.tuning.force({"ELEMENTS": 64, "PAIRS": pairs}):
        check_call(q, k, cos, sin, interleaved=True)
        check_gradients(q, k, cos, sin, interleaved=True)
        if backend.runs_triton:
            want = "split in registers" if pairs == "split" else "gathered"
            assert want in xkernels.ops.explain(rotary_embedding, q, k, cos, sin, 1, True).variant


def test_an_unknown_pairing_in_a_table_is_refused(backend, device):
    if not backend.runs_triton:
        pytest.skip("the backend runs PyTorch: no plan reads the table")
    q = hf_layout(1, 3, 2, 8, torch.float32, device)
    cos = rand((1, 3, 8), torch.float32, device)
    with xkernels.tuning.force({"ELEMENTS": 64, "PAIRS": "shuffle"}), pytest.raises(ValueError, match="PAIRS"):
        rotary_embedding(q, q, cos, cos, 1, True)


def test_interleaved_with_values_per_column(backend, device, poison):
    """Nothing assumes cos[2i] == cos[2i + 1] (forward and backward), in either layout of q."""
    q, k = hf_layout(2, 4, 2, 16, torch.float32, device), hf_layout(2, 4, 1, 16, torch.float32, device)
    cos, sin = rand((2, 4, 16), torch.float32, device), rand((2, 4, 16), torch.float32, device)
    check_call(q, k, cos, sin, interleaved=True)
    check_gradients(q, k, cos, sin, interleaved=True)
    q, k = rand((2, 4, 2, 16), torch.float32, device), rand((2, 4, 1, 16), torch.float32, device)
    check_call(q, k, cos, sin, 2, interleaved=True)
    check_gradients(q, k, cos, sin, 2, interleaved=True)


def test_interleaved_compile_fullgraph(backend, device):
    q, k = hf_layout(1, 4, 2, 16, torch.float32, device), hf_layout(1, 4, 1, 16, torch.float32, device)
    cos, sin = pair_angles(1, 4, 16, torch.float32, device)
    fn = torch.compile(lambda *a: rotary_embedding(*a, interleaved=True), fullgraph=True, backend="aot_eager")
    got = fn(q, k, cos, sin)
    assert_close(got[0], complex_rotation(q, cos, sin), torch.float32)
    assert_close(got[1], complex_rotation(k, cos, sin), torch.float32)
