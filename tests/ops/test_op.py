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
from helpers import CheckCounter, Unchanged, assert_close, rand
from xkernels import tuning
from xkernels.ops import add, broadcast, linear, matmul
from xkernels.ops.matmul.vendor import reference_linear


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
        "archs": {"default": [{"when": {"m_max": 64}, "config": split,  # measured: on cuda a kernel needs evidence
                               "measured": {"shapes": [], "by": "test"}}]}}))

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


# -- every documented call form repeats through a hot entry, with per-call values -------------
def _repeat(op, monkeypatch, backend, calls):
    """Run ``calls`` (each: a function of fresh inputs returning (result, float64 reference,
    dtype)) and check each result; return whether only the first one ran ``check``."""
    counter = CheckCounter(op, monkeypatch)
    for call in calls:
        got, ref, dtype = call()
        assert_close(got, ref, dtype, scale=10)
    return counter.n == (1 if _hot_expected(backend) else len(calls))


def test_add_alpha_keyword_is_hot_and_takes_each_alpha(backend, device, monkeypatch):
    def call(alpha):
        def run():
            x, y = rand((9, 70), torch.float32, device), rand((70,), torch.float32, device)
            with Unchanged(x, y):
                return add(x, y, alpha=alpha), x.double() + alpha * y.double(), torch.float32
        return run

    alphas = [2.0, 3.0, -0.5, 0.0, -0.0, 1e-3, 2.0]
    assert _repeat(add, monkeypatch, backend, [call(a) for a in alphas])
    x, y = rand((9, 70), torch.float32, device), rand((70,), torch.float32, device)
    assert (add.hot_entry(x, y, alpha=7.0) is not None) == _hot_expected(backend)
    assert add.hot_entry(x, y, alpha=7) is None  # an int alpha is another signature
    assert add.hot_entry(x, y) is None  # alpha == 1 is another kernel: another signature
    got = add(x, y, alpha=1.0)
    assert_close(got, x.double() + y.double(), torch.float32)


def test_add_python_scalars_are_hot_and_take_each_value(backend, device, monkeypatch):
    def right(v, alpha=1):
        def run():
            x = rand((5, 33), torch.float16, device)
            with Unchanged(x):
                return add(x, v, alpha=alpha), x.double() + alpha * v, torch.float16
        return run

    def left(v):
        def run():
            y = rand((5, 33), torch.float16, device)
            return add(v, y), v + y.double(), torch.float16
        return run

    assert _repeat(add, monkeypatch, backend, [right(v) for v in (2.0, -3.5, 0.25, 2.0)])
    assert _repeat(add, monkeypatch, backend, [right(v, alpha=a) for v, a in ((2.5, 2), (1.5, -3), (0.5, 4))])
    assert _repeat(add, monkeypatch, backend, [left(v) for v in (1.5, -7.0, 0.0)])


def test_int_scalars_across_specialisation_classes(backend, device, monkeypatch):
    """Triton specialises int arguments on == 1 and on divisibility by 16: an entry made with
    one value must launch the right variant for the others."""
    def right(v):
        def run():
            x = rand((4, 40), torch.int32, device)
            return add(x, v, alpha=3), x.long() + 3 * v, torch.int32
        return run

    assert _repeat(add, monkeypatch, backend, [right(v) for v in (5, 1, 16, 32, 7, 1)])
    x = rand((4, 40), torch.int32, device)
    with pytest.raises(TypeError, match="'alpha' 2.5 is not an integer"):  # checked per value: never hot
        add(x, x, alpha=2.5)


def test_broadcast_out_keyword_is_hot(backend, device, monkeypatch):
    def run():
        x, b = rand((6, 50), torch.bfloat16, device), rand((50,), torch.bfloat16, device)
        out = torch.full((6, 50), float("nan"), dtype=torch.bfloat16, device=device)
        with Unchanged(x, b):
            assert broadcast(x, b, out=out) is out
        return out, x.double() + b.double(), torch.bfloat16

    assert _repeat(broadcast, monkeypatch, backend, [run] * 3)


@pytest.mark.parametrize("form", ["activation=", "bias=", "bias=, activation="])
def test_linear_keyword_forms_are_hot(backend, device, form, monkeypatch):
    def run():
        x, w, b = rand((7, 24), torch.float32, device), rand((20, 24), torch.float32, device), \
            rand((20,), torch.float32, device)
        if form == "activation=":
            got, ref = linear(x, w, b, activation="gelu"), reference_linear(x.double(), w.double(), b.double(), "gelu")
        elif form == "bias=":
            got, ref = linear(x, w, bias=b), reference_linear(x.double(), w.double(), b.double(), None)
        else:
            got = linear(x, w, bias=b, activation="silu")
            ref = reference_linear(x.double(), w.double(), b.double(), "silu")
        return got, ref, torch.float32

    assert _repeat(linear, monkeypatch, backend, [run] * 3)


def test_linear_takes_each_slope_and_activation(backend, device, monkeypatch):
    def leaky(slope):
        def run():
            x, w, b = rand((7, 24), torch.float32, device), rand((20, 24), torch.float32, device), \
                rand((20,), torch.float32, device)
            return (linear(x, w, b, "leaky_relu", negative_slope=slope),
                    reference_linear(x.double(), w.double(), b.double(), "leaky_relu", slope), torch.float32)
        return run

    assert _repeat(linear, monkeypatch, backend, [leaky(s) for s in (0.1, 0.3, -0.2, 0.0, 0.1)])
    x, w = rand((7, 24), torch.float32, device), rand((20, 24), torch.float32, device)
    for act in ("relu", "gelu", "relu", None):  # the activation is part of the signature
        assert_close(linear(x, w, None, act), reference_linear(x.double(), w.double(), None, act), torch.float32,
                     scale=10)
        assert_close(linear(x, w, activation=act), reference_linear(x.double(), w.double(), None, act),
                     torch.float32, scale=10)


def test_split_k_leaky_relu_takes_each_slope(backend, device, tmp_path):
    """The split-K reduction applies the activation: its entries take the slope per call too."""
    import json

    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no table to add")
    split = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3,
             "SPLIT_K": 2}
    (tmp_path / "linear.json").write_text(json.dumps({
        "op": "linear", "backend": backend.name, "source": "test",
        "archs": {"default": [{"when": {"m_max": 64}, "config": split,  # measured: on cuda a kernel needs evidence
                               "measured": {"shapes": [], "by": "test"}}]}}))

    class Tables:
        @xkernels.hookimpl
        def xkernels_add_tuning_dirs(self):
            return [xkernels.TuningDir(backend=backend.name, path=tmp_path)]

    plugin = Tables()
    xkernels.registry.register(plugin, name="test-op-split-k-slope")
    try:
        x, w, b = rand((8, 80), torch.float32, device), rand((24, 80), torch.float32, device), \
            rand((24,), torch.float32, device)
        assert linear.explain(x, w, b, "leaky_relu").config.get("SPLIT_K") == 2
        for slope in (0.1, 0.5, -0.25):
            got = linear(x, w, b, "leaky_relu", negative_slope=slope)
            assert_close(got, reference_linear(x.double(), w.double(), b.double(), "leaky_relu", slope),
                         torch.float32, scale=10)
        assert linear.hot_entry(x, w, b, "leaky_relu", negative_slope=0.7) is not None
    finally:
        xkernels.registry.unregister(plugin)


def test_every_route_takes_the_arguments_in_params_order(backend, device):
    """Every form hands its route the call's arguments in ``params`` order, defaults filled in:
    ``op(a, b)`` included (no entry relies on its own defaults matching the op's)."""
    from xkernels.ops import Route

    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no routes")
    x, y = rand((6, 40), torch.float32, device), rand((6, 40), torch.float32, device)
    add(x, y)
    _, route, canon = add.find_hot((x, y), {})
    assert isinstance(route, Route) and route.kind == "triton kernel"
    assert canon[:2] == (x, y) and canon[2:] == (None, 1)
    assert add.repeat_route(x, y) is route and add.hot_entry(x, y) is route.run
    w = rand((8, 40), torch.float32, device)
    linear(x, w, activation="relu")
    _, route, canon = linear.find_hot((x, w), {"activation": "relu"})
    assert canon[2:] == (None, "relu", 0.01, None, None)  # bias, activation, slope, residual, out
    if route.kind == "triton kernel":  # cuda may send it to the BLAS's relu epilogue: a route autograd records
        assert not route.records_autograd and route.autograd_run is None


def test_a_route_builder_failure_is_an_error_naming_op_and_signature(backend, device, monkeypatch):
    """``make_hot`` raising is a bug: the call raises a RouteError instead of silently leaving its
    signature on the slow path; a builder returning something other than a Route is a TypeError."""
    from xkernels.ops import RouteError

    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no routes")

    def broken(plan, call, canon):
        raise KeyError("BLOCK")

    monkeypatch.setattr(add, "make_hot", broken)
    x, y = rand((5, 7), torch.float32, device), rand((5, 7), torch.float32, device)
    with pytest.raises(RouteError, match=r"xkernels.ops.add: building the route of signature \('2t'.*KeyError"):
        add(x, y)
    monkeypatch.setattr(add, "make_hot", lambda plan, call, canon: (lambda *a: None))
    with pytest.raises(TypeError, match="make_hot must return a KernelRoute"):
        add(x, y)
    monkeypatch.undo()
    assert_close(add(x, y), x.double() + y.double(), torch.float32)
