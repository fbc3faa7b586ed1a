"""The native front door (ops/native_front_door.py, backends/native_route.h): every call form's
repeats run from the op's C++ route table with fresh data, NaN-poisoned results and unchanged
inputs, against float64 torch; every call the table must not run (a gradient, another layout,
another scalar value, a forced config, another backend, a misaligned pointer, a partly
overlapping ``out=``, a mode, a tensor subclass) goes to the Python front door and is right."""

from __future__ import annotations

import sys

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close, dot_scale, every_matmul_to_vendor, rand
from xkernels import tuning
from xkernels.backends import native
from xkernels.ops import add, broadcast, linear, matmul
from xkernels.ops.matmul.vendor import reference_linear
from xkernels.ops.op import Op


@pytest.fixture
def ext(backend):
    """The loaded extension with results NaN-poisoned before each native launch; every op's table
    and routes emptied before and after."""
    if native.setting() == "0":
        pytest.skip("XKERNELS_NATIVE=0: the native extension is turned off for this run")
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no routes")
    mod = native.module(wait=True)
    assert mod is not None, f"the native extension did not build: {native.unavailable_reason()}"
    ops = (add, broadcast, linear, matmul)
    for op in ops:
        assert op._native is not None, f"{op.name} has no native route table"
        op._forget()
        op._native.take_hits()
    mod.set_poison(True)
    try:
        yield mod
    finally:
        mod.set_poison(False)
        for op in ops:
            op._forget()


def _repeats(op, call, reference, dtype, n=3):
    """``call()`` (fresh inputs each time: it makes them and returns (inputs, result, the op's
    (args, kwargs))) twice (the full path, which teaches the table; a repeat), then ``n`` times:
    each result against ``reference`` of the same inputs (a matmul's tolerance grows with K = 40,
    as the matmul suite's). Every route has a native form on the interpreters, and those repeats
    run from the table; on cuda a float32 matmul kernel (its precision follows torch's TF32
    setting per call) has none, and Python runs it."""
    scale = 40 ** 0.5 if op in (matmul, linear) else 1.0
    for i in range(n + 2):
        inputs, result, (args, kwargs) = call()
        assert_close(result, reference(*inputs), dtype, scale=scale)
        if i == 1:
            op._native.take_hits()
    _, route, canon = op.find_hot(args, kwargs)
    native_form = route.native is not None and route.native(canon) is not None
    if not result.is_cuda:
        assert native_form, f"{op.name}: {route} has no native form"
    elif dtype == torch.float32 and op in (matmul, linear) and route.kind == "triton kernel":
        assert not native_form, f"{op.name}: a float32 kernel route on cuda has a native form"
    assert op._native.take_hits() == (n if native_form else 0), f"{op.name}: not every repeat ran natively"


def _guarded(fn, *tensors):
    with Unchanged(*tensors):
        return fn()


FORMS = {  # op, (x, y, b, w, o) -> the op's (args, kwargs), the reference of (x, y, b, w, o)
    "add(x, y)": (add, lambda x, y, b, w, o: ((x, y), {}), lambda x, y, b, w, o: x + y),
    "add(x, 2.5)": (add, lambda x, y, b, w, o: ((x, 2.5), {}), lambda x, y, b, w, o: x + 2.5),
    "add(-1.0, y)": (add, lambda x, y, b, w, o: ((-1.0, y), {}), lambda x, y, b, w, o: y - 1.0),
    "add(x, y, alpha=2)": (add, lambda x, y, b, w, o: ((x, y), {"alpha": 2}), lambda x, y, b, w, o: x + 2 * y),
    "add(x, y, out=o)": (add, lambda x, y, b, w, o: ((x, y), {"out": o}), lambda x, y, b, w, o: x + y),
    "broadcast(x, b)": (broadcast, lambda x, y, b, w, o: ((x, b), {}), lambda x, y, b, w, o: x + b),
    "broadcast(x, b, out=o)": (broadcast, lambda x, y, b, w, o: ((x, b), {"out": o}), lambda x, y, b, w, o: x + b),
    "matmul(x, w.T)": (matmul, lambda x, y, b, w, o: ((x, w.t()), {}), lambda x, y, b, w, o: x @ w.t()),
    "linear(x, w)": (linear, lambda x, y, b, w, o: ((x, w), {}), lambda x, y, b, w, o: x @ w.t()),
    "linear(x, w, b2)": (linear, lambda x, y, b, w, o: ((x, w, b[:24]), {}),
                         lambda x, y, b, w, o: x @ w.t() + b[:24]),
    "linear(x, w, b2, 'gelu')": (linear, lambda x, y, b, w, o: ((x, w, b[:24], "gelu"), {}),
                                 lambda x, y, b, w, o: reference_linear(x, w, b[:24], "gelu", 0.01)),
    "linear(x, w, bias=b2, activation='gelu_tanh')": (
        linear, lambda x, y, b, w, o: ((x, w), {"bias": b[:24], "activation": "gelu_tanh"}),
        lambda x, y, b, w, o: reference_linear(x, w, b[:24], "gelu_tanh", 0.01)),
    "linear(x, w, b2, 'relu')": (linear, lambda x, y, b, w, o: ((x, w, b[:24], "relu"), {}),
                                 lambda x, y, b, w, o: reference_linear(x, w, b[:24], "relu", 0.01)),
    "linear(x, w, bias=b2, activation='leaky_relu', negative_slope=0.2)": (
        linear, lambda x, y, b, w, o: ((x, w), {"bias": b[:24], "activation": "leaky_relu", "negative_slope": 0.2}),
        lambda x, y, b, w, o: reference_linear(x, w, b[:24], "leaky_relu", 0.2)),
}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_form_repeats_from_the_native_table(backend, device, ext, form, dtype):
    op, call_args, ref = FORMS[form]

    def fresh():
        x, y = rand((6, 40), dtype, device), rand((6, 40), dtype, device)
        b, w = rand((40,), dtype, device), rand((24, 40), dtype, device)
        o = torch.full((6, 40), float("nan"), dtype=dtype, device=device)
        args, kwargs = call_args(x, y, b, w, o)
        result = _guarded(lambda: op(*args, **kwargs), x, y, b, w)
        if "out=o" in form:
            assert result is o
        return (x, y, b, w, o), result, (args, kwargs)

    _repeats(op, fresh, lambda *t: ref(*(v.double() for v in t)), dtype)


def test_a_3d_input_and_batched_matmul(backend, device, ext):
    def lin():
        x, w, b = rand((2, 5, 40), torch.float32, device), rand((24, 40), torch.float32, device), \
            rand((24,), torch.float32, device)
        return (x, w, b), _guarded(lambda: linear(x, w, b), x, w, b), ((x, w, b), {})

    _repeats(linear, lin, lambda x, w, b: x.double() @ w.double().t() + b.double(), torch.float32)

    def bmm():
        a, b = rand((3, 6, 16), torch.bfloat16, device), rand((3, 16, 10), torch.bfloat16, device)
        return (a, b), _guarded(lambda: matmul(a, b), a, b), ((a, b), {})

    _repeats(matmul, bmm, lambda a, b: a.double() @ b.double(), torch.bfloat16)


def test_the_blas_routes_run_from_the_table(backend, device, ext, monkeypatch):
    """Routes that are the device's BLAS (``F.linear``, ``torch.matmul``, and ``F.linear`` then an
    activation, or the activation in the BLAS epilogue where the backend has one): the table calls
    aten's ``.out`` kernels and the activation itself; the results are PyTorch's own, exactly."""
    with every_matmul_to_vendor(monkeypatch):
        cases = [
            (linear, lambda: (rand((6, 40), torch.float32, device), rand((24, 40), torch.float32, device),
                              rand((24,), torch.float32, device)), lambda x, w, b: linear(x, w, b),
             lambda x, w, b: torch.nn.functional.linear(x, w, b)),
            (linear, lambda: (rand((2, 3, 40), torch.float32, device), rand((24, 40), torch.float32, device)),
             lambda x, w: linear(x, w), lambda x, w: torch.nn.functional.linear(x, w)),
            (linear, lambda: (rand((40, 6), torch.float32, device).t(), rand((24, 40), torch.float32, device)),
             lambda x, w: linear(x, w), lambda x, w: torch.nn.functional.linear(x, w)),
            (linear, lambda: (rand((2, 3, 40), torch.float32, device), rand((24, 40), torch.float32, device),
                              rand((24,), torch.float32, device)), lambda x, w, b: linear(x, w, b, "gelu"),
             lambda x, w, b: reference_linear(x, w, b, "gelu")),
            (linear, lambda: (rand((6, 40), torch.float32, device), rand((24, 40), torch.float32, device)),
             lambda x, w: linear(x, w, activation="leaky_relu", negative_slope=0.3),
             lambda x, w: reference_linear(x, w, None, "leaky_relu", 0.3)),
            (linear, lambda: (rand((6, 40), torch.float32, device), rand((24, 40), torch.float32, device),
                              rand((24,), torch.float32, device)), lambda x, w, b: linear(x, w, b, "relu"),
             lambda x, w, b: reference_linear(x, w, b, "relu")),
            (matmul, lambda: (rand((6, 40), torch.float32, device), rand((40, 24), torch.float32, device)),
             lambda a, b: matmul(a, b), torch.matmul),
            (matmul, lambda: (rand((2, 6, 40), torch.float32, device), rand((2, 40, 24), torch.float32, device)),
             lambda a, b: matmul(a, b), torch.matmul),
        ]
        # poisoned, the table allocates each result and calls the .out kernels; else the BLAS
        # allocates it (mm / addmm / bmm)
        for poison in (True, False):
            ext.set_poison(poison)
            for op, make, call, want in cases:
                for i in range(5):
                    args = make()
                    got = _guarded(lambda: call(*args), *args)
                    assert torch.equal(got, want(*args)) and got.is_contiguous(), (op.name, poison)
                    if i == 1:
                        op._native.take_hits()
                assert op._native.take_hits() == 3, (op.name, poison)
        ext.set_poison(True)
        # matmul forms the check reshapes (a batch folded into M, a 1-D operand promoted): the
        # table's mm / bmm would see the caller's shapes, so it does not take them
        for a_shape, b_shape in (((2, 6, 40), (40, 24)), ((40,), (40, 24)), ((6, 40), (40,))):
            for _ in range(4):
                a, b = rand(a_shape, torch.float32, device), rand(b_shape, torch.float32, device)
                assert torch.equal(_guarded(lambda: matmul(a, b), a, b), torch.matmul(a, b))
            assert matmul._native.take_hits() == 0, (a_shape, b_shape)
        # a 3-D input that is not contiguous: F.linear does not fold it, nor does the table take it
        x = rand((3, 40, 2), torch.float32, device).transpose(1, 2)
        w = rand((24, 40), torch.float32, device)
        for _ in range(3):
            assert_close(linear(x, w), x.double() @ w.double().t(), torch.float32, scale=40 ** 0.5)
        assert linear._native.take_hits() == 0


@pytest.mark.parametrize("rows", [16, 512])
def test_repeats_follow_each_calls_pointers_and_data(backend, device, ext, rows):
    """Repeats from the table with calls alternating between inputs held alive (other pointers),
    an output written through ``out=``, and a weight changed in place between calls (same
    pointer, new data): each gives the result of its own operands."""
    cuda = device.type == "cuda"
    dt, n = (torch.bfloat16, 768) if cuda else (torch.float32, 48)  # (the interpreter computes slowly)
    rows = rows if cuda else rows // 16
    w, b = rand((n, n), dt, device), rand((n,), dt, device)
    xs = [rand((rows, n), dt, device) for _ in range(3)]
    o = torch.empty((rows, n), dtype=dt, device=device)
    for i in range(8):
        x = xs[i % 3]
        if i % 4 == 3:
            with torch.no_grad():
                w.mul_(-0.5)
        want = x.double() @ w.double().t() + b.double()
        assert_close(linear(x, w, b), want, dt, scale=n ** 0.5)
        assert_close(matmul(x, w.t(), out=o), want - b.double(), dt, scale=n ** 0.5)
    assert linear._native.take_hits() + matmul._native.take_hits() > 0


def test_what_the_table_does_not_run_goes_to_python(backend, device, ext, monkeypatch):
    x, y = rand((6, 40), torch.float32, device), rand((6, 40), torch.float32, device)
    for _ in range(2):
        add(x, y)
    add._native.take_hits()
    # a gradient: autograd records the op; the gradient is right
    xg = x.clone().requires_grad_()
    (add(xg, y) * 2).sum().backward()
    assert torch.equal(xg.grad, torch.full_like(x, 2.0))
    with torch.no_grad():  # no grad mode: the table runs it
        assert_close(add(xg, y), x.double() + y.double(), torch.float32)
    assert add._native.take_hits() == 1
    # another layout (transposed operands), another dtype, another shape: other keys, Python first
    for a, b in ((x.t(), y.t()), (x.double(), y.double()), (x[:3], y[:3])):
        assert_close(add(a, b), a.double() + b.double(), a.dtype)
    assert add._native.take_hits() == 0
    # another scalar value, -0.0 and 0.0, an int and a float: each its own entry, right each time
    for s in (1.5, 2.5, -0.0, 0.0, 2, 2.0, 1.5):
        for _ in range(3):
            assert_close(add(x, s), x.double() + s, torch.float32)
    # a forced tuning config (sweeps): never from the table
    add._native.take_hits()
    with tuning.force({"BLOCK": 256, "SUB": None, "num_warps": 4}):
        assert_close(add(x, y), x.double() + y.double(), torch.float32)
    assert add._native.take_hits() == 0
    # another backend in effect: another key
    other = "interpreter-npu" if backend.name == "interpreter" else "interpreter"
    if backend.device_type == "cpu" and xkernels.get_backend(other).is_available():
        with xkernels.use_backend(other):
            for _ in range(3):
                assert_close(add(x, y), x.double() + y.double(), torch.float32)
        assert add._native.take_hits() == 2  # its own entry: planned and taught, then run (not this backend's)
    # a torch function mode, a tensor subclass: Python
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Mode():
        assert_close(add(x, y), x.double() + y.double(), torch.float32)

    class Sub(torch.Tensor):
        pass

    assert_close(add(x.as_subclass(Sub), y).as_subclass(torch.Tensor), x.double() + y.double(), torch.float32)
    assert add._native.take_hits() == 0


def test_out_overlap_and_alignment_are_checked_per_call(backend, device, ext):
    """``out=`` aliasing an input exactly runs; a partial overlap raises as the op's check does,
    with nothing written; a pointer off 16-byte alignment is declined by the launch and runs
    through Python (which copies or relaunches)."""
    buf = rand((8, 40), torch.float32, device)
    y = rand((7, 40), torch.float32, device)
    for _ in range(3):
        x = rand((7, 40), torch.float32, device)
        want = x.double() + y.double()
        assert add(x, y, out=x) is x  # out is x itself
        assert_close(x, want, torch.float32)
    add._native.take_hits()
    x, o = buf[:7], buf[1:]  # same layout as the remembered signature: o partly overlaps x
    before = buf.clone()
    with pytest.raises(ValueError, match="out"):
        add(x, y, out=o)
    assert torch.equal(buf, before), "a declined call wrote its result"
    base = rand((6 * 40 + 1,), torch.float32, device)
    for _ in range(3):
        x, y2 = rand((6, 40), torch.float32, device), rand((6, 40), torch.float32, device)
        add(x, y2)
    off = base[1:].view(6, 40)  # contiguous, the same key, a pointer 4 bytes past alignment
    add._native.take_hits()
    assert_close(add(off, y2), off.double() + y2.double(), torch.float32)


def test_module_forward_repeats_from_the_table_and_follows_its_parameters(backend, device, ext):
    """``xkernels.nn.Linear`` without a gradient: repeats from the table; a parameter replaced or
    converted, another input layout, a parametrization: right every time."""
    layer = xkernels.nn.Linear(40, 24, activation="gelu", device=device)
    with torch.no_grad():
        for _ in range(4):
            x = rand((6, 40), torch.float32, device)
            assert_close(layer(x), reference_linear(x.double(), layer.weight.double(), layer.bias.double(), "gelu",
                                                    0.01), torch.float32, scale=dot_scale(40))
        assert linear._native.take_hits() >= 2
        layer.weight = torch.nn.Parameter(rand((24, 40), torch.float32, device))
        layer.to(torch.bfloat16)
        for _ in range(3):
            x = rand((6, 40), torch.bfloat16, device)
            assert_close(layer(x), reference_linear(x.double(), layer.weight.double(), layer.bias.double(), "gelu",
                                                    0.01), torch.bfloat16, scale=dot_scale(40))
        torch.nn.utils.parametrize.register_parametrization(layer, "weight", _Double())
        x = rand((6, 40), torch.bfloat16, device)
        assert_close(layer(x), reference_linear(x.double(), 2 * layer.parametrizations.weight.original.double(),
                                                layer.bias.double(), "gelu", 0.01), torch.bfloat16, scale=dot_scale(40))


class _Double(torch.nn.Module):
    def forward(self, w):
        return 2 * w


@pytest.mark.parametrize("activation", [None, "gelu", "leaky_relu"])
def test_training_calls_given_to_pytorch_repeat_from_the_table(backend, device, ext, monkeypatch, activation):
    """A training call the training policy gives PyTorch's ops (``nn._trains_through_xkernels``
    False, as on a host-bound GPU): its repeats run ``F.linear`` and the activation from the
    table, recorded by autograd: outputs and every gradient bit-equal to ``torch.nn.Linear`` and
    the activation's, the graph kept (``requires_grad``, a grad_fn). Frozen weights and no_grad are other keys:
    each right too."""
    from xkernels import nn as xnn
    from xkernels.ops.matmul.vendor import activate

    monkeypatch.setattr(xnn, "_trains_through_xkernels", lambda x, w: False)
    layer = xkernels.nn.Linear(40, 24, activation=activation, negative_slope=0.2, device=device)
    ref = torch.nn.Linear(40, 24, device=device)
    with torch.no_grad():
        ref.weight.copy_(layer.weight)
        ref.bias.copy_(layer.bias)
    linear._native.take_hits()
    for i in range(4):
        x = rand((3, 6, 40), torch.float32, device).requires_grad_(True)
        xr = x.detach().clone().requires_grad_(True)
        y = layer(x)
        want = activate(ref(xr), activation, 0.2)
        assert y.requires_grad and y.grad_fn is not None
        assert torch.equal(y, want)
        dy = torch.randn_like(y)
        y.backward(dy)
        want.backward(dy)
        for got, exp in ((x.grad, xr.grad), (layer.weight.grad, ref.weight.grad), (layer.bias.grad, ref.bias.grad)):
            assert torch.equal(got, exp)
        for p in (*layer.parameters(), *ref.parameters()):
            p.grad = None
        if i == 0:
            assert linear._native.take_hits() == 0  # the first call teaches the table
    assert linear._native.take_hits() == 3
    layer.weight.requires_grad_(False)  # frozen: another key (the weight records nothing)
    ref.weight.requires_grad_(False)
    for _ in range(2):
        x = rand((3, 6, 40), torch.float32, device).requires_grad_(True)
        assert torch.equal(layer(x), activate(ref(x), activation, 0.2))
    assert linear._native.take_hits() == 1
    with torch.no_grad():  # no gradient: the op's own route, never the training one
        x = rand((3, 6, 40), torch.float32, device)
        y = layer(x)
        assert not y.requires_grad
        assert_close(y, reference_linear(x.double(), layer.weight.double(), layer.bias.double(), activation, 0.2),
                     torch.float32, scale=40 ** 0.5)


def _one_node_pair(device, activation, shape, bias=True, dtype=torch.float32):
    """An ``xkernels.nn.Linear`` whose training calls go to PyTorch's ops (policy monkeypatched by
    the caller) and a ``torch.nn.Linear`` with the same parameters."""
    k = shape[-1]
    layer = xkernels.nn.Linear(k, 24, bias=bias, activation=activation, negative_slope=0.2, device=device,
                               dtype=dtype)
    ref = torch.nn.Linear(k, 24, bias=bias, device=device, dtype=dtype)
    with torch.no_grad():
        ref.weight.copy_(layer.weight)
        if bias:
            ref.bias.copy_(layer.bias)
    return layer, ref


def _grads_equal(layer, ref, x, xr, y, want, create_graph=False):
    """Backward of the same ``dy`` through both; every gradient bit-equal. Returns the grads."""
    dy = torch.randn_like(y)
    ins = [t for t in (x, layer.weight, layer.bias) if t is not None and t.requires_grad]
    ins_r = [t for t in (xr, ref.weight, ref.bias) if t is not None and t.requires_grad]
    got = torch.autograd.grad(y, ins, dy, create_graph=create_graph)
    exp = torch.autograd.grad(want, ins_r, dy, create_graph=create_graph)
    for g, e in zip(got, exp, strict=True):
        assert torch.equal(g, e), (g - e).abs().max()
    return got, exp


ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu", "leaky_relu", "quick_gelu", "relu2"]


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape,bias", [((5, 40), True), ((3, 6, 40), True), ((2, 3, 4, 40), True),
                                        ((3, 6, 40), False), ((7, 40), False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_repeats_record_one_linear_node(backend, device, ext, monkeypatch, activation, shape, bias, dtype):
    """A training call given to PyTorch's ops repeats from the table as one grad_fn
    (``xkernels::LinearBackward``): output and every gradient bit-equal to ``torch.nn.Linear`` +
    the activation's for each activation, 2-D to 4-D inputs, with and without bias, float32 and
    bfloat16, frozen
    weights and an input that needs no gradient; the input is left unchanged."""
    from xkernels import nn as xnn
    from xkernels.ops.matmul.vendor import activate

    monkeypatch.setattr(xnn, "_trains_through_xkernels", lambda x, w: False)
    layer, ref = _one_node_pair(device, activation, shape, bias, dtype)
    linear._native.take_hits()
    for i, (x_grad, w_grad) in enumerate([(True, True)] * 3 + [(True, False)] * 2 + [(False, True)] * 2):
        layer.weight.requires_grad_(w_grad)
        ref.weight.requires_grad_(w_grad)
        x = rand(shape, dtype, device).requires_grad_(x_grad)
        xr = x.detach().clone().requires_grad_(x_grad)
        with Unchanged(x):
            y = layer(x)
            want = activate(ref(xr), activation, 0.2)
            assert torch.equal(y, want)
            assert y.requires_grad
            if i in (1, 2, 4, 6):  # a repeat of its key: from the table, one node
                assert y.grad_fn.name() == "xkernels::LinearBackward", y.grad_fn
            _grads_equal(layer, ref, x, xr, y, want)
    assert linear._native.take_hits() == 4


@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
def test_one_linear_node_keeps_autograds_contracts(backend, device, ext, monkeypatch, activation):
    """The one-node record behaves as PyTorch's nodes: an in-place change of the output is
    differentiated; an in-place change of a saved input fails the backward loudly; under
    saved-tensor hooks it steps aside for PyTorch's nodes (non-reentrant activation checkpointing,
    its first call and repeats, gives torch's gradients);
    a ``create_graph`` backward gives torch's second-order gradients; autocast and a
    non-contiguous input record PyTorch's own nodes (and are right)."""
    from torch.utils.checkpoint import checkpoint

    from xkernels import nn as xnn
    from xkernels.ops.matmul.vendor import activate

    monkeypatch.setattr(xnn, "_trains_through_xkernels", lambda x, w: False)
    layer, ref = _one_node_pair(device, activation, (3, 6, 40))
    fresh = lambda: rand((3, 6, 40), torch.float32, device).requires_grad_(True)  # noqa: E731
    layer(fresh())  # teaches the table
    # the output changed in place
    x = fresh()
    xr = x.detach().clone().requires_grad_(True)
    y = layer(x)
    assert y.grad_fn.name() == "xkernels::LinearBackward"
    y.mul_(3.0)
    want = activate(ref(xr), activation, 0.2) * 3.0  # (torch's relu saves its result: not in place)
    _grads_equal(layer, ref, x, xr, y, want)
    # a saved input changed in place: PyTorch's version-counter error
    x = fresh()
    h = x * 1.0
    y = layer(h)
    with torch.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    # saved-tensor hooks (activation checkpointing): PyTorch's own nodes, whose saves they pack,
    # so that a checkpointed forward and its recomputation save the same tensors whichever of the
    # Python path (the teaching call) and the table each took
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        y = layer(fresh())
    assert y.grad_fn.name() != "xkernels::LinearBackward" and packed
    for first in (True, False):
        if first:
            linear._forget()  # the checkpointed forward teaches the table; its recomputation repeats
        x = fresh()
        xr = x.detach().clone().requires_grad_(True)
        y = checkpoint(layer, x, use_reentrant=False)
        want = checkpoint(lambda t: activate(ref(t), activation, 0.2), xr, use_reentrant=False)
        assert torch.equal(y, want)
        _grads_equal(layer, ref, x, xr, y, want)
    # second order
    x = fresh()
    xr = x.detach().clone().requires_grad_(True)
    y = layer(x)
    want = activate(ref(xr), activation, 0.2)
    got, exp = _grads_equal(layer, ref, x, xr, y, want, create_graph=True)
    g2 = torch.autograd.grad(sum((g * g).sum() for g in got), [x, layer.weight, layer.bias], allow_unused=True)
    e2 = torch.autograd.grad(sum((g * g).sum() for g in exp), [xr, ref.weight, ref.bias], allow_unused=True)
    for a, b in zip(g2, e2, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # autocast and a non-contiguous input: PyTorch's own nodes
    xt = rand((3, 40, 6), torch.float32, device).transpose(1, 2).requires_grad_(True)
    for _ in range(2):
        y = layer(xt)
    assert y.grad_fn.name() != "xkernels::LinearBackward"
    assert torch.equal(y, activate(ref(xt), activation, 0.2))
    with torch.autocast(device.type, dtype=torch.bfloat16):
        for _ in range(2):
            y = layer(fresh())
            want = activate(ref(fresh()), activation, 0.2)
        assert y.grad_fn.name() != "xkernels::LinearBackward"
        assert y.dtype == want.dtype == torch.bfloat16


def test_enable_launches_matmul_routes_from_cpp(monkeypatch):
    """Under ``enable()``, mm / addmm repeats whose route is xkernels' kernel launch from the C++
    overrides (its BLAS route: aten's ``.out`` kernel from C++): on cuda where a GPU is present,
    else on cpu tensors with the interpreter as the process's backend (no ``use_backend`` block,
    during which the C++ overrides defer to Python). The Python override sees each signature
    twice (the call that plans, the repeat that teaches); results against float64."""
    from helpers import require_interpreter
    from xkernels import dispatch, routing

    if native.setting() == "0":
        pytest.skip("XKERNELS_NATIVE=0: the native extension is turned off for this run")
    assert native.module(wait=True) is not None, native.unavailable_reason()
    if torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        require_interpreter()
        monkeypatch.setattr(dispatch, "_env_backend", "interpreter")
        device = torch.device("cpu")
    seen = []
    real = routing._repeat
    monkeypatch.setattr(routing, "_repeat", lambda name, *a, **k: (  # the float32 calls the Python override saw
        routing._thread.inside or a[1][0].dtype != torch.float32 or seen.append(name)) and None or real(name, *a, **k))
    matmul._forget()
    linear._forget()
    native.module().set_poison(True)
    xkernels.enable(ops=["linear", "matmul"])
    routing.routing_counts(reset=True)
    try:
        for _ in range(4):
            a, w, bias = (rand((6, 40), torch.float32, device), rand((40, 24), torch.float32, device),
                          rand((24,), torch.float32, device))
            with Unchanged(a, w, bias):
                # (K = 40: the matmul suite's tolerance, which grows with sqrt(K))
                assert_close(a @ w, a.double() @ w.double(), torch.float32, scale=40 ** 0.5)
                assert_close(torch.addmm(bias, a, w), a.double() @ w.double() + bias.double(), torch.float32,
                             scale=40 ** 0.5)
        counts = routing.routing_counts()
    finally:
        xkernels.disable()
        native.module().set_poison(False)
        matmul._forget()
        linear._forget()
    assert seen.count("mm") == 2 and seen.count("addmm") == 2, seen
    for name in ("mm", "addmm"):  # (the float64 references went to aten)
        ours = {k: v for k, v in counts[name].items() if k in ("xkernels", routing.VENDOR_WHY)}
        assert sum(ours.values()) == 4, counts
        if device.type == "cpu":
            assert ours == {"xkernels": 4}, counts


def test_training_route_declines_while_a_cuda_graph_is_captured(backend, device, ext, monkeypatch):
    """While a CUDA graph is captured the policy trains through xkernels (replays cost no host
    time): the table's torch_linear route must not run then, and the Python path decides."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a cuda device")
    from xkernels import nn as xnn

    monkeypatch.setattr(xnn, "_trains_through_xkernels", lambda x, w: False)
    layer = xkernels.nn.Linear(64, 32, device=device)
    x = rand((8, 64), torch.float32, device).requires_grad_(True)
    for _ in range(2):  # taught, then a repeat from the table
        layer(x)
    assert linear._native.take_hits() == 1
    recorded = []
    real = xnn.RouteCache.recorded
    monkeypatch.setattr(xnn.RouteCache, "recorded", lambda self, *a: recorded.append(1) or real(self, *a))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        layer(x)  # warm the path on the side stream
        recorded.clear()
        linear._native.take_hits()
        with torch.cuda.graph(graph, stream=stream):
            y = layer(x)
    torch.cuda.current_stream().wait_stream(stream)
    assert linear._native.take_hits() == 0 and recorded == [1], "the table ran a training call while captured"
    graph.replay()
    torch.cuda.synchronize()
    assert_close(y, reference_linear(x.detach().double(), layer.weight.detach().double(),
                                     layer.bias.detach().double(), None, 0.01), torch.float32, scale=8)


def _python_calls(fn):
    """``fn()``'s result and the code objects of the Python functions it called."""
    seen = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is not fn.__code__:
            seen.append(frame.f_code)

    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, seen


def test_a_repeat_runs_from_the_op_class_call_slot_without_python(backend, device, ext, monkeypatch):
    """Each public op's class calls its route table from C (``backends/native_call.h``): a repeat
    the table runs enters no Python function at all, a call it declines runs ``Op.__call__``, and
    the class keeps its Python ``__call__`` (what torch.compile traces, and what runs without the
    extension)."""
    from xkernels.ops.op import REGISTERED

    for op in REGISTERED.values():
        # never over a class's own __call__; a slot a spy dropped comes back at the op's next
        # repeat (test_reassigning_an_op_class_call_drops_the_slot), or here
        assert type(op).__call__ is Op.__call__ or not ext.op_call_installed(type(op)), op.name
        op._restore_call_slot()
        assert ext.op_call_installed(type(op)) == (type(op).__call__ is Op.__call__), op.name
    with every_matmul_to_vendor(monkeypatch):
        x, w, b = (rand((6, 40), torch.float32, device), rand((24, 40), torch.float32, device),
                   rand((24,), torch.float32, device))
        for _ in range(2):
            linear(x, w, b)
        got, calls = _python_calls(lambda: linear(x, w, b))
        assert calls == [] and torch.equal(got, torch.nn.functional.linear(x, w, b))
        # declined by the table (a weight requiring grad while grad mode is on): Python records it
        wg = w.clone().requires_grad_()
        got, calls = _python_calls(lambda: linear(x, wg, b))
        assert Op.__call__.__code__ in calls and got.requires_grad
        assert torch.equal(got.detach(), torch.nn.functional.linear(x, w, b))
    y = rand((6, 40), torch.float32, device)
    for _ in range(2):
        add(x, y)
    got, calls = _python_calls(lambda: add(x, y))
    # a kernel route: the interpreters launch in Python (Triton's interpreter), cuda from C
    assert Op.__call__.__code__ not in calls and (calls == [] or not got.is_cuda), [c.co_name for c in calls]
    assert_close(got, x.double() + y.double(), torch.float32)


def test_reassigning_an_op_class_call_drops_the_slot(backend, device, ext, monkeypatch):
    """CPython recomputes a class's call slot when its ``__call__`` is assigned: the new one runs.
    Where it is restored (a spy undone), the next repeat, found by ``Op.__call__``'s own table
    call, puts the C slot back."""
    cls = type("Reassigned", (type(add),), {})
    assert ext.install_op_call(cls) and ext.op_call_installed(cls)
    op = object.__new__(cls)  # no Op.__init__: nothing registers
    cls.__call__ = lambda self, *args, **kwargs: "python"
    assert not ext.op_call_installed(cls) and op(1, 2) == "python"
    assert not ext.install_op_call(int)  # a static type's slot is left alone
    x, y = rand((4, 8), torch.float32, device), rand((4, 8), torch.float32, device)
    seen = []
    with monkeypatch.context() as m:
        m.setattr(type(add), "__call__", lambda self, *a, **k: seen.append(1) or Op.__call__(self, *a, **k))
        assert not ext.op_call_installed(type(add))
        for _ in range(3):
            assert_close(add(x, y), x.double() + y.double(), torch.float32)
        assert seen == [1, 1, 1] and not ext.op_call_installed(type(add))  # the spy saw every call
    assert not ext.op_call_installed(type(add))  # undone: CPython's Python slot
    assert_close(add(x, y), x.double() + y.double(), torch.float32)  # a repeat, in Op.__call__
    assert ext.op_call_installed(type(add))
    got, calls = _python_calls(lambda: add(x, y))
    assert Op.__call__.__code__ not in calls
