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
    with pytest.raises(TypeError, match="at least one of 'x' and 'y' must be a tensor"):
        add(1, 2)
    with pytest.raises(TypeError, match="'alpha' 0.5 is not an integer but the result dtype is torch.int32"):
        add(rand((4, 6), torch.int32, device), rand((4, 6), torch.int32, device), alpha=0.5)
    with pytest.raises(ValueError, match=r"'out' has shape \(4, 7\)"):
        add(x, x, out=poisoned((4, 7), torch.float32, device))
    with pytest.raises(ValueError, match="internal overlap"):
        add(x, x, out=poisoned((1, 6), torch.float32, device).expand(4, 6))
    assert torch.isnan(out).all()


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
