"""The op front door's repeated-call path (``ops/op.py``: hot entries keyed by signature).

A second call with the same signature must skip ``check`` and planning on backends that run the
Triton kernels, give the same results as the full path, and fall back to the full path for
anything its signature does not pin down (keyword arguments, another backend override, a
forced tuning config, misaligned pointers, a plugin registered in between).
"""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close, rand
from xkernels import tuning
from xkernels.ops import add, broadcast, linear, matmul
from xkernels.ops.matmul import reference_linear


class CheckCounter:
    """Counts calls of ``op.check`` (the full path's first step)."""

    def __init__(self, op, monkeypatch):
        self.n = 0
        real = op.check

        def counted(*args, **kwargs):
            self.n += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(op, "check", counted)


@pytest.fixture(autouse=True)
def _cold_start():
    """Each test starts with no hot entries (other tests leave theirs behind)."""
    for op in (add, broadcast, linear, matmul):
        op._forget()


def _hot_expected(backend) -> bool:
    return backend.runs_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_add_repeat_skips_checks_and_matches(backend, device, dtype, monkeypatch):
    counter = CheckCounter(add, monkeypatch)
    x, y = rand((37, 129), dtype, device), rand((37, 129), dtype, device)
    first = add(x, y)
    assert counter.n == 1
    for _ in range(2):  # fresh data, same signature
        x, y = rand((37, 129), dtype, device), rand((37, 129), dtype, device)
        with Unchanged(x, y):
            got = add(x, y)
        assert_close(got, x.double() + y.double(), dtype)
        assert got.is_contiguous() and got.device.type == device.type
        assert got.data_ptr() != first.data_ptr() or first is not got
    assert counter.n == (1 if _hot_expected(backend) else 3)


def test_broadcast_repeat_bias_row(backend, device, monkeypatch):
    counter = CheckCounter(broadcast, monkeypatch)
    for _ in range(3):
        x, b = rand((64, 300), torch.float16, device), rand((300,), torch.float16, device)
        with Unchanged(x, b):
            got = broadcast(x, b)
        assert_close(got, x.double() + b.double(), torch.float16)
    assert counter.n == (1 if _hot_expected(backend) else 3)


def test_result_takes_the_promoted_dtype_and_broadcast_shape(backend, device):
    # the output comes from neither operand's shape: the hot path must allocate it itself
    for _ in range(2):
        x, y = rand((5, 1, 7), torch.float16, device), rand((1, 4, 7), torch.float32, device)
        got = add(x, y)
        assert got.dtype == torch.float32 and got.shape == (5, 4, 7)
        assert_close(got, x.double() + y.double(), torch.float32)


def test_new_signature_keywords_and_backend_change_take_the_full_path(backend, device, monkeypatch):
    counter = CheckCounter(add, monkeypatch)
    x, y = rand((40, 40), torch.float32, device), rand((40, 40), torch.float32, device)
    add(x, y)
    add(x, y)
    base = counter.n
    add(x.t(), y)  # other strides
    add(x[:20], y[:20])  # other shape
    add(x, y, alpha=2)  # keyword
    out = torch.empty_like(x)
    add(x, y, out=out)
    assert counter.n == base + 4
    assert_close(out, x.double() + y.double(), torch.float32)
    if device.type == "cpu" and backend.name != "cpu":
        with xkernels.use_backend("cpu"):  # same signature, another backend: routed anew
            add(x, y)
        assert counter.n == base + 5


def test_out_repeat_is_hot_and_keeps_the_aliasing_rule(backend, device, monkeypatch):
    counter = CheckCounter(add, monkeypatch)
    shape = (33, 70)
    for _ in range(3):  # a separate out, fresh data each time, poisoned first
        x, y = rand(shape, torch.float32, device), rand(shape, torch.float32, device)
        out = torch.full(shape, float("nan"), device=device)
        with Unchanged(x, y):
            assert add(x, y, out=out) is out
        assert_close(out, x.double() + y.double(), torch.float32)
    assert counter.n == (1 if _hot_expected(backend) else 3)
    x, y = rand(shape, torch.float32, device), rand(shape, torch.float32, device)
    want = x.double() + y.double()
    assert add(x, y, out=x) is x  # in place: out is x's own view, same signature as above
    assert_close(x, want, torch.float32)
    buf = rand((34 * 70,), torch.float32, device)
    a, b = buf[:33 * 70].view(shape), buf[70:].view(shape)  # b starts one row into a
    before = buf.clone()
    with pytest.raises(ValueError, match="partially overlaps"):
        add(a, y, out=b)
    assert torch.equal(buf, before)  # nothing written


def test_forced_tuning_config_bypasses_hot_entries(backend, device, monkeypatch):
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no kernel config to force")
    counter = CheckCounter(add, monkeypatch)
    x, y = rand((4096,), torch.float32, device), rand((4096,), torch.float32, device)
    add(x, y)
    add(x, y)
    with tuning.force({"BLOCK": 128, "SUB": 128}):
        got = add(x, y)
        assert add.explain(x, y).config["BLOCK"] == 128
    assert_close(got, x.double() + y.double(), torch.float32)
    assert counter.n == 2 + 1  # first call + explain + the forced call; the repeat was hot


def test_misaligned_views_after_an_aligned_call(backend, device):
    n = 1000
    buf_x, buf_y = rand((n + 8,), torch.float16, device), rand((n + 8,), torch.float16, device)
    add(buf_x[:n], buf_y[:n])
    for off in (0, 1, 3, 0):  # same shape and strides, pointers 2 or 6 bytes past 16-byte alignment
        x, y = buf_x[off:off + n], buf_y[off:off + n]
        assert_close(add(x, y), x.double() + y.double(), torch.float16)


def test_registering_a_plugin_drops_hot_entries(backend, device, monkeypatch):
    counter = CheckCounter(add, monkeypatch)
    x, y = rand((50,), torch.float32, device), rand((50,), torch.float32, device)
    add(x, y)
    add(x, y)
    before = counter.n

    class NoOp:
        @xkernels.hookimpl
        def xkernels_add_tuning_dirs(self):
            return []

    plugin = NoOp()
    xkernels.registry.register(plugin, name="test-op-noop")
    try:
        add(x, y)
        assert counter.n == before + 1
    finally:
        xkernels.registry.unregister(plugin)


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_and_matmul_repeat(backend, device, activation, monkeypatch):
    c_lin, c_mm = CheckCounter(linear, monkeypatch), CheckCounter(matmul, monkeypatch)
    for _ in range(3):
        x = rand((2, 24, 48), torch.float32, device)
        w, b = rand((40, 48), torch.float32, device), rand((40,), torch.float32, device)
        with Unchanged(x, w, b):
            got = linear(x, w, b, activation)
        assert got.shape == (2, 24, 40)
        ref = reference_linear(x.double(), w.double(), b.double(), activation)
        assert_close(got, ref, torch.float32, scale=30)
        a, m = rand((3, 33, 20), torch.float32, device), rand((3, 20, 17), torch.float32, device)
        assert_close(matmul(a, m), a.double() @ m.double(), torch.float32, scale=30)
    expected = 1 if _hot_expected(backend) else 3
    assert (c_lin.n, c_mm.n) == (expected, expected)


def test_linear_without_bias_then_with(backend, device):
    x, w = rand((16, 32), torch.float16, device), rand((24, 32), torch.float16, device)
    b = rand((24,), torch.float16, device)
    for args in ((x, w), (x, w, b), (x, w), (x, w, None, "relu"), (x, w, b, "relu")):
        full = (*args, None, None)[:4]
        ref = reference_linear(*(a.double() if isinstance(a, torch.Tensor) else a for a in full))
        assert_close(linear(*args), ref, torch.float16, scale=30)


def test_split_k_repeat_is_hot(backend, device, tmp_path, monkeypatch):
    """A table rule with SPLIT_K: repeats take the hot path (two launches) with fresh data."""
    import json

    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no table to add")
    split = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3,
             "SPLIT_K": 3}
    (tmp_path / "matmul.json").write_text(json.dumps({
        "op": "matmul", "backend": backend.name, "source": "test",
        "archs": {"default": [{"when": {"m_max": 64}, "config": split}]}}))

    class Tables:
        @xkernels.hookimpl
        def xkernels_add_tuning_dirs(self):
            return [xkernels.TuningDir(backend=backend.name, path=tmp_path)]

    plugin = Tables()
    xkernels.registry.register(plugin, name="test-op-split-k")
    try:
        probe = rand((40, 100), torch.float32, device), rand((100, 24), torch.float32, device)
        assert matmul.explain(*probe).config.get("SPLIT_K") == 3
        counter = CheckCounter(matmul, monkeypatch)
        for _ in range(3):
            a, b = rand((40, 100), torch.float32, device), rand((100, 24), torch.float32, device)
            with Unchanged(a, b):
                got = matmul(a, b)
            assert_close(got, a.double() @ b.double(), torch.float32, scale=10)
        assert counter.n == (1 if _hot_expected(backend) else 3)
    finally:
        xkernels.registry.unregister(plugin)
