"""add(x, y, alpha=1): torch.add semantics on every test backend."""

from __future__ import annotations

import threading

import pytest
import torch

from helpers import Unchanged, assert_close, poisoned, rand
from xkernels.ops import add

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64]
SHAPES = [
    ((256, 256), (256, 256)),
    ((7,), (7,)),
    ((65539,), (65539,)),
    ((3, 1000), (1000,)),
    ((5, 1, 7), (1, 4, 7)),         # broadcasting on both sides
    ((2, 1, 1, 9), (2, 3, 9, 9)),   # mask on the left
    ((), (4, 5)),
]


def _ref(x, y, alpha=1):
    if isinstance(x, torch.Tensor) and not (x.dtype.is_floating_point or
                                            (isinstance(y, torch.Tensor) and y.dtype.is_floating_point)):
        if not isinstance(y, float):
            return torch.add(x, y, alpha=alpha)
    xd = x.double() if isinstance(x, torch.Tensor) else x
    yd = y.double() if isinstance(y, torch.Tensor) else y
    return xd + alpha * yd


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("xs,ys", SHAPES, ids=str)
def test_shapes(backend, device, dtype, xs, ys):
    x, y = rand(xs, dtype, device), rand(ys, dtype, device)
    with Unchanged(x, y):
        got = add(x, y)
    assert_close(got, _ref(x, y), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_alpha(backend, device, dtype):
    x, y = rand((33, 65), dtype, device), rand((33, 65), dtype, device)
    alpha = 3 if not dtype.is_floating_point else -0.5
    assert_close(add(x, y, alpha=alpha), _ref(x, y, alpha), dtype, scale=2)


def test_promotion(backend, device):
    h, f = rand((8, 9), torch.float16, device), rand((8, 9), torch.float32, device)
    got = add(h, f)
    assert got.dtype == torch.float32
    assert_close(got, h.double() + f.double(), torch.float32)
    i = rand((8, 9), torch.int32, device)
    got = add(i, f)
    assert got.dtype == torch.float32
    assert_close(got, i.double() + f.double(), torch.float32)
    assert add(i, rand((8, 9), torch.int64, device)).dtype == torch.int64
    assert add(torch.ones(3, 4, dtype=torch.bfloat16, device=device), torch.ones(3, 4, dtype=torch.float16,
                                                                                 device=device)).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int32], ids=str)
def test_python_scalars(backend, device, dtype):
    x = rand((17, 31), dtype, device)
    assert_close(add(x, 3), _ref(x, 3), dtype)
    assert_close(add(2, x), _ref(x, 2), dtype)
    got = add(x, 0.25)
    want = torch.float32 if not dtype.is_floating_point else dtype
    assert got.dtype == want == torch.result_type(x, 0.25)
    assert_close(got, x.double() + 0.25, want)
    zero_d = rand((), dtype, device)
    assert_close(add(x, zero_d), _ref(x, zero_d), dtype)


def test_layouts_out_in_place(backend, device):
    base = rand((48, 80), torch.float32, device)
    for x in (base.t(), base[::2, ::3], rand((1, 80), torch.float32, device).expand(48, 80)):
        y = rand(x.shape, torch.float32, device)
        assert_close(add(x, y), x.double() + y.double())
    x, y = rand((48, 80), torch.float32, device), rand((48, 80), torch.float32, device)
    out = poisoned((48, 80), torch.float32, device)
    assert add(x, y, out=out) is out
    assert_close(out, x.double() + y.double())
    ref = x.double() + y.double()
    add(x, y, out=x)
    assert_close(x, ref)
    assert add(torch.empty(0, 3, device=device), torch.empty(0, 3, device=device)).shape == (0, 3)


def test_fallback_dtypes(backend, device):
    for dtype in (torch.float64, torch.complex64, torch.int8, torch.bool):
        x = (torch.randn(6, 5) * 10).to(dtype).to(device)
        y = (torch.randn(6, 5) * 10).to(dtype).to(device)
        torch.testing.assert_close(add(x, y), torch.add(x, y))


def test_bad_input(backend, device):
    x = rand((4, 6), torch.float32, device)
    out = poisoned((4, 6), torch.float32, device)
    with pytest.raises(ValueError, match=r"shapes do not broadcast: 'x' \(4, 6\), 'y' \(4, 5\)"):
        add(x, rand((4, 5), torch.float32, device), out=out)
    with pytest.raises(TypeError, match="argument 'y' must be a tensor or a Python number, got str"):
        add(x, "1")
    with pytest.raises(TypeError, match="'alpha' 0.5 is not an integer but the result dtype is torch.int32"):
        add(rand((4, 6), torch.int32, device), rand((4, 6), torch.int32, device), alpha=0.5)
    with pytest.raises(TypeError, match="'alpha' 2.0 is not an integer but the result dtype is torch.int64"):
        add(rand((4, 6), torch.int64, device), 3, alpha=2.0)
    with pytest.raises(TypeError, match="'alpha' True is a bool but the result dtype is torch.float32"):
        add(x, x, alpha=True, out=out)
    with pytest.raises(TypeError, match="'alpha' must be a real number for result dtype torch.float32"):
        add(x, x, alpha=1j, out=out)
    with pytest.raises(ValueError, match=r"'out' has shape \(4, 7\)"):
        add(x, x, out=poisoned((4, 7), torch.float32, device))
    with pytest.raises(ValueError, match="internal overlap"):
        add(x, x, out=poisoned((1, 6), torch.float32, device).expand(4, 6))
    assert torch.isnan(out).all()


NUMBERS = [-8.47, -1.77, 3, -4, 0, True, False, 1 + 2j, 2**62]
ALPHAS = [None, 1, -3, 0.5, 1.0, True, False, 1j]


def _same_as_torch(call, torch_call):
    """``call()`` gives exactly ``torch_call()`` (value, dtype, device, shape), or both raise
    (ours a TypeError/ValueError, never something else)."""
    try:
        want = torch_call()
    except Exception:
        with pytest.raises((TypeError, ValueError)):
            call()
        return
    got = call()
    assert (got.dtype, got.device, got.shape) == (want.dtype, want.device, want.shape)
    assert torch.equal(got, want), (got, want)


def test_two_python_numbers_match_torch(backend, device):
    """torch.add of two Python numbers: a 0-d CPU tensor of torch's dtype, whatever the backend."""
    for x in NUMBERS:
        for y in NUMBERS:
            for alpha in ALPHAS:
                kw = {} if alpha is None else {"alpha": alpha}
                _same_as_torch(lambda: add(x, y, **kw), lambda: torch.add(x, y, **kw))
    assert add(-8.47, -1.77).dtype == torch.float32 and add(3, 4).dtype == torch.int64
    assert add(True, False).dtype == torch.bool and add(1j, 2).dtype == torch.complex64
    assert add(-8.47, -1.77).device == torch.device("cpu")
    assert add.explain(3, 4.5).route == "torch"
    with pytest.raises(ValueError, match="'x' 9223372036854775808 is outside int64"):
        add(2**63, 1)
    with pytest.raises(TypeError, match="argument 'y' must be a tensor or a Python number, got str"):
        add(1, "2")


def test_two_python_numbers_follow_the_default_dtype(backend, device):
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for x, y in ((-8.47, -1.77), (3, 0.1), (1j, 2), (4, 5)):
            _same_as_torch(lambda: add(x, y, alpha=2), lambda: torch.add(x, y, alpha=2))
        assert add(0.1, 0.2).dtype == torch.float64 and add(1j, 2).dtype == torch.complex128
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64], ids=str)
def test_two_python_numbers_out(backend, device, dtype):
    x, y = {torch.float32: (-8.47, 2), torch.int64: (3, -4), torch.bool: (True, False),
            torch.complex64: (1 + 2j, 0.5)}[dtype]
    out = torch.zeros((), dtype=dtype) if dtype == torch.bool else poisoned((), dtype, "cpu") \
        if dtype != torch.complex64 else torch.full((), complex("nan"), dtype=dtype)
    assert add(x, y, out=out) is out
    want = torch.add(x, y)
    assert out.dtype == want.dtype and torch.equal(out, want)
    out = poisoned((), torch.float16, "cpu")
    with pytest.raises(TypeError, match="'out' has dtype torch.float16, the result has dtype torch.float32"):
        add(1.5, 2.5, out=out)
    with pytest.raises(ValueError, match=r"'out' has shape \(1,\), the result has shape \(\)"):
        add(1.5, 2.5, out=poisoned((1,), torch.float32, "cpu"))
    assert torch.isnan(out)


def test_meta_device_is_rejected_across_devices(backend, device):
    x = rand((4, 6), torch.float32, device)
    with pytest.raises(ValueError, match=r"tensors must be on one device, got 'x' on .*, 'y' on meta"):
        add(x, torch.empty(4, 6, device="meta"))


def test_threads(backend, device):
    """Concurrent calls from several threads give each its own right answer."""
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(37, 53, generator=g).to(device)
            y = torch.randn(53, generator=g).to(device)
            for _ in range(3):
                assert_close(add(x, y), x.double() + y.double())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_beyond_2_31_elements(backend, device):
    """Offsets past 2**31 - 1 (int64 index path). Needs ~13 GB of device memory: GPU backends."""
    if backend.device_type == "cpu":
        pytest.skip("2**31 elements need an accelerator's memory and speed; runs on cuda/npu")
    n = 2**31 + 4099
    x = torch.randn(n // 4096 + 1, 4096, device=device, dtype=torch.float16)
    bias = torch.randn(4096, device=device, dtype=torch.float16)
    got = add(x, bias)
    for rows in (slice(0, 2), slice(-2, None)):  # both ends; the last rows sit past 2**31
        assert_close(got[rows], x[rows].double() + bias.double(), torch.float16)
    del got
    y = torch.randn_like(x)
    got = add(x.view(-1), y.view(-1))  # flat same-shape path
    assert_close(got[-5000:], x.view(-1)[-5000:].double() + y.view(-1)[-5000:].double(), torch.float16)
