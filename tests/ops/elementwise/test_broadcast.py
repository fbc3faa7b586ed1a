"""broadcast(x, bias): x + bias with bias broadcast to x's shape, on every test backend."""

from __future__ import annotations

import pytest
import torch

from helpers import Unchanged, assert_close, poisoned, rand
from xkernels.ops import broadcast

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64]

# (x shape, bias shape): what users pass
PATTERNS = [
    ((64, 96), (96,)),              # bias of length x.shape[-1]: the fast path
    ((5, 1000), (1000,)),           # odd trailing size
    ((3, 7), (7,)),
    ((2, 4097), (4097,)),
    ((2, 3, 5, 6), (3, 1, 1)),      # per-channel over NCHW
    ((2, 3, 8, 8), (2, 1, 1, 8)),   # attention-mask style [B,1,1,S] over [B,H,S,S]
    ((9, 33), (1, 33)),
    ((4, 5, 6), (1,)),              # single element
    ((4, 5, 6), ()),                # 0-d bias
    ((65539,), (65539,)),           # same shape, odd size
    ((2, 3, 4, 5, 6, 7), (4, 1, 6, 1)),  # more dims than the kernel's four: collapses or copies
]


def _ref(x, b):
    if x.dtype.is_floating_point or b.dtype.is_floating_point:
        return x.double() + b.double()
    return x + b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("xs,bs", PATTERNS, ids=str)
def test_patterns(backend, device, dtype, xs, bs):
    x, b = rand(xs, dtype, device), rand(bs, dtype, device)
    with Unchanged(x, b):
        got = broadcast(x, b)
    assert_close(got, _ref(x, b), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_layouts(backend, device, dtype):
    base = rand((40, 66), dtype, device)
    views = {
        "transposed": base.t(),
        "step-sliced": base[::3, ::2],
        "expanded": rand((1, 66), dtype, device).expand(40, 66),
    }
    for x in views.values():
        b = rand((x.shape[-1],), dtype, device)
        assert_close(broadcast(x, b), x.double() + b.double(), dtype)
        bexp = rand((1,), dtype, device).expand(x.shape[-1])  # stride-0 bias
        assert_close(broadcast(x, bexp), x.double() + bexp.double(), dtype)


def test_out_and_in_place(backend, device):
    x, b = rand((33, 70), torch.float32, device), rand((70,), torch.float32, device)
    ref = x.double() + b.double()
    out = poisoned((33, 70), torch.float32, device)
    assert broadcast(x, b, out=out) is out
    assert_close(out, ref)
    out_t = poisoned((70, 33), torch.float32, device).t()  # non-contiguous out
    broadcast(x, b, out=out_t)
    assert_close(out_t, ref)
    y = x.clone()
    broadcast(y, b, out=y)  # in place
    assert_close(y, ref)


def test_promotion_and_empty(backend, device):
    x, b = rand((6, 10), torch.float16, device), rand((10,), torch.float32, device)
    got = broadcast(x, b)
    assert got.dtype == torch.float32
    assert_close(got, x.double() + b.double(), torch.float32)
    e = broadcast(torch.empty((0, 10), device=device), rand((10,), torch.float32, device))
    assert e.shape == (0, 10)
    z = broadcast(rand((), torch.float32, device), rand((), torch.float32, device))
    assert z.shape == ()


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64], ids=str)
def test_fallback_dtypes_are_correct(backend, device, dtype):
    x = torch.randn(5, 7, dtype=dtype, device=device)
    b = torch.randn(7, dtype=dtype, device=device)
    torch.testing.assert_close(broadcast(x, b), x + b)


def test_bad_input(backend, device):
    x, b = rand((4, 6), torch.float32, device), rand((6,), torch.float32, device)
    out = poisoned((4, 6), torch.float32, device)
    with pytest.raises(ValueError, match=r"'bias' of shape \(4, 1, 6\) would grow 'x' of shape \(4, 6\)"):
        broadcast(x, rand((4, 1, 6), torch.float32, device), out=out)
    with pytest.raises(ValueError, match=r"shapes do not broadcast: 'x' \(4, 6\), 'bias' \(5,\)"):
        broadcast(x, rand((5,), torch.float32, device), out=out)
    with pytest.raises(TypeError, match="argument 'bias' must be a torch.Tensor, got list"):
        broadcast(x, [1.0] * 6, out=out)
    with pytest.raises(ValueError, match=r"'out' has shape \(6, 4\), the result has shape \(4, 6\)"):
        broadcast(x, b, out=poisoned((6, 4), torch.float32, device))
    with pytest.raises(TypeError, match="'out' has dtype torch.float16, the result has dtype torch.float32"):
        broadcast(x, b, out=poisoned((4, 6), torch.float16, device))
    with pytest.raises(ValueError, match="partially overlaps input 'x'"):
        broadcast(x, b, out=x.as_strided((4, 6), (1, 4)))
    assert torch.isnan(out).all(), "nothing may be written when the call is rejected"
