"""The native extension (backends/native.py, native.cpp) and the add + norm training calls it
records (ops/fused/add_norm_native.py): built from a fresh checkout, the same results and
gradients as the Python autograd path and float64, every fallback taken where it must be."""

from __future__ import annotations

import pytest
import torch

from helpers import Unchanged, rand
from xkernels.backends import native
from xkernels.ops import add_layer_norm, add_rms_norm
from xkernels.ops.fused import add_norm_bwd, add_norm_native


@pytest.fixture(scope="module")
def ext():
    """The built extension; a build failure fails the test (set XKERNELS_NATIVE=0 to run without)."""
    if native.setting() == "0":
        pytest.skip("XKERNELS_NATIVE=0: the native extension is turned off for this run")
    mod = native.module(wait=True)
    assert mod is not None, f"the native extension did not build: {native.unavailable_reason()}"
    return mod


@pytest.fixture
def fresh(monkeypatch):
    for op in (add_layer_norm, add_rms_norm):
        op._forget()
    monkeypatch.setattr(add_norm_native, "POISON", True)
    yield
    for op in (add_layer_norm, add_rms_norm):
        op._forget()


def python_only(monkeypatch):
    monkeypatch.setattr(native, "ready", lambda: None)
    monkeypatch.setattr(native, "module", lambda wait=False: None)


def test_build_is_cached_and_loads(ext, tmp_path):
    assert native.status() == "loaded"
    assert native.build_dir().name.startswith(torch.__version__.replace("+", "_"))
    assert (native.build_dir() / f"{native.NAME}.so").exists()
    cmd = native.compile_command(tmp_path / "x.so")
    assert str(native.SOURCE) in cmd and "-std=c++17" in cmd


def test_unbuildable_warns_once_and_keeps_python(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_reason", None)
    monkeypatch.setattr(native, "_builder", None)
    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-xk")
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        assert native.module(wait=True) is None
    assert "no-such-compiler-xk" in native.unavailable_reason()
    assert native.module() is None  # said once: later calls return quietly


def test_turned_off(monkeypatch):
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_reason", None)
    monkeypatch.setenv("XKERNELS_NATIVE", "0")
    assert native.module(wait=True) is None and native.unavailable_reason() == "XKERNELS_NATIVE=0"


def test_no_load_once_the_interpreter_exits(ext, monkeypatch):
    """After the exit hook (``_stop_loading``, registered with atexit) a build does not load the
    extension: a daemon build thread inside its C++ while the interpreter finalizes would abort
    the process. Quietly: no warning."""
    import warnings

    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_reason", None)
    monkeypatch.setattr(native, "_builder", None)
    monkeypatch.setattr(native, "_exiting", False)
    monkeypatch.setenv("XKERNELS_NATIVE", "1")
    native._stop_loading()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.module(wait=True) is None
    assert native.unavailable_reason() == "the interpreter is exiting"


def _training(kind, dtype, device, *, residual=True, weight=True, bias=True, offset=0.0, with_ds=True,
              needs=(True, True, True, True), dy_strided=False, calls=4):
    """``calls`` training calls of one signature with fresh data: per call the outputs, every
    gradient and the grad_fn's name."""
    n, rows = 48, 6
    w0 = rand((n,), dtype, device) if weight else None
    b0 = rand((n,), dtype, device) if bias and kind == "layer" else None
    out = []
    for _ in range(calls):
        x0, r0 = rand((rows, n), dtype, device), rand((rows, n), dtype, device) if residual else None
        x, r, w, b = [None if t is None else t.clone().requires_grad_(need)
                      for t, need in zip((x0, r0, w0, b0), needs)]
        dy = rand((rows, 2 * n), dtype, device)[:, ::2] if dy_strided else rand((rows, n), dtype, device)
        ds = rand((rows, n), dtype, device) if with_ds else None
        with Unchanged(x0, r0, w0, b0, dy, ds):
            if kind == "layer":
                y, s = add_layer_norm(x, r, w, b, 1e-5)
            else:
                y, s = add_rms_norm(x, r, w, 1e-6, offset=offset)
            name = y.grad_fn.name()
            torch.autograd.backward((y, s) if with_ds else (y,), (dy, ds) if with_ds else (dy,))
        grads = [None if t is None or not t.requires_grad else t.grad for t in (x, r, w, b)]
        out.append((name, y.detach(), s.detach(), grads, (x0, r0, w0, b0, dy, ds)))
    return out


CASES = {
    "layer": dict(kind="layer"),
    "rms-offset": dict(kind="rms", offset=1.0),
    "no-residual": dict(kind="layer", residual=False),
    "no-weight": dict(kind="rms", weight=False),
    "no-ds": dict(kind="layer", with_ds=False),
    "weight-only": dict(kind="layer", needs=(False, False, True, True)),
    "x-only": dict(kind="rms", needs=(True, False, False, False)),
    "strided-dy": dict(kind="layer", dy_strided=True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_native_matches_python_path(ext, backend, device, fresh, monkeypatch, case, dtype):
    """The same signature's training calls with the native grad_fn and with the Python one (a
    fresh route each): bit-identical outputs and gradients, call after call; the native node
    records the route's repeats (its third call on) wherever the backend launches kernels."""
    args = CASES[case]
    torch.manual_seed(1)
    got = _training(dtype=dtype, device=device, **args)
    for op in (add_layer_norm, add_rms_norm):
        op._forget()
    with monkeypatch.context() as m:
        python_only(m)
        torch.manual_seed(1)
        want = _training(dtype=dtype, device=device, **args)
    names = [c[0] for c in got]
    if backend.runs_triton:
        assert names[2:] == ["AddNormBackward"] * 2, names
    else:
        assert "AddNormBackward" not in names
    assert "AddNormBackward" not in [c[0] for c in want]
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g[1], w[1]) and torch.equal(g[2], w[2]), f"call {i}: outputs differ"
        for k, (a, b) in enumerate(zip(g[3], w[3])):
            assert (a is None) == (b is None), f"call {i}: gradient {k} presence"
            if a is not None:
                assert a.dtype == b.dtype and a.shape == b.shape and not torch.isnan(a.float()).any()
                assert torch.equal(a, b), f"call {i}: gradient {k} differs from the Python path"


def test_parameter_gradients_summed_by_one_kernel(ext, backend, device, fresh, monkeypatch):
    """d(w) and d(b) come from one ``part_sum_kernel`` launch per backward, in the native
    backwards too (not aten's ``sum`` and casts), and in the parameters' dtype."""
    if not backend.runs_triton:
        pytest.skip("no kernel route on this backend: nothing is recorded natively")
    from xkernels.launch import Launcher

    sums = []
    real = Launcher.__call__

    def counting(self, *args):
        if "W_TY" in self.constexprs:
            sums.append(self.constexprs["W_TY"])
        return real(self, *args)

    monkeypatch.setattr(Launcher, "__call__", counting)
    add_norm_bwd._plans.clear()  # a plan of an earlier test would launch by its record from the first call
    handed = []  # what each native backward was handed for the sum: a launch, or None (aten's sum)
    real_sum = add_norm_bwd.HotBackward._native_sum
    monkeypatch.setattr(add_norm_bwd.HotBackward, "_native_sum",
                        lambda self, *a: handed.append(real_sum(self, *a)) or handed[-1])
    calls = _training("layer", torch.bfloat16, device, calls=5)
    assert [c[0] for c in calls][2:] == ["AddNormBackward"] * 3
    assert handed and all(h is not None for h in handed), handed
    if backend.name.startswith("interpreter"):  # every launch is Python there, the native ones' too
        assert len(sums) == 5, f"{len(sums)} part_sum_kernel launches for 5 backwards"
    else:  # the first by Triton's launcher, the repeats by the launch record (C), unseen here
        assert len(sums) >= 1
    for _, _, _, grads, _ in calls:
        assert grads[2].dtype == grads[3].dtype == torch.bfloat16


def _reference_grads(kind, x, r, w, b, dy, ds, eps=1e-5):
    sd = (x if r is None else x + r).double().requires_grad_()
    wd, bd = [None if t is None else t.double().requires_grad_() for t in (w, b)]
    y = torch.nn.functional.layer_norm(sd, (sd.shape[-1],), wd, bd, eps)
    ((y * dy.double()).sum() + (0 if ds is None else (sd * ds.double()).sum())).backward()
    return sd.grad, sd.grad, wd.grad, bd.grad


def test_native_backward_installed_once_then_launched(ext, backend, device, fresh, monkeypatch):
    """The signature's first native backward goes to Python once (which hands its launch to the
    spec); the next ones launch from C++ without calling Python; gradients against float64."""
    if not backend.runs_triton:
        pytest.skip("no kernel route on this backend: nothing is recorded natively")
    seen = []
    real = add_norm_native._fallback
    monkeypatch.setattr(add_norm_native, "_fallback", lambda *a: seen.append(1) or real(*a))
    calls = _training("layer", torch.float32, device, calls=6)
    assert [c[0] for c in calls][2:] == ["AddNormBackward"] * 4
    assert len(seen) == 1, f"{len(seen)} Python backwards among 4 native ones"
    x0, r0, w0, b0, dy, ds = calls[-1][4]
    for got, want in zip(calls[-1][3], _reference_grads("layer", x0, r0, w0, b0, dy, ds)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def _native_call(device):
    w = rand((32,), torch.float32, device).requires_grad_()
    for _ in range(3):
        x = rand((4, 32), torch.float32, device).requires_grad_()
        y, s = add_layer_norm(x, None, w, None, 1e-5)
    assert y.grad_fn.name() == "AddNormBackward"
    return x, w, y, s


def test_native_steps_aside_for_saved_tensor_hooks(ext, backend, device, fresh):
    """Under saved-tensor hooks the native grad_fn steps aside for the Python one, whose saves the
    hooks pack; non-reentrant activation checkpointing then gives the uncheckpointed gradients bit
    for bit, from the signature's first call on (its forward and recomputation saving alike)."""
    from torch.utils.checkpoint import checkpoint

    if not backend.runs_triton:
        pytest.skip("no kernel route on this backend: nothing is recorded natively")
    x, w, y, s = _native_call(device)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        y, s = add_layer_norm(x, None, w, None, 1e-5)
    assert y.grad_fn.name() != "AddNormBackward" and packed
    b = rand((32,), torch.float32, device).requires_grad_()

    def block(x, r):
        y, s = add_layer_norm(x, r, w, b, 1e-5)
        return y * 2 + s

    for i in range(4):
        x0, r0 = rand((4, 32), torch.float32, device), rand((4, 32), torch.float32, device)
        grads = []
        for wrap in (lambda f, *a: checkpoint(f, *a, use_reentrant=False), lambda f, *a: f(*a)):
            x, r = x0.clone().requires_grad_(), r0.clone().requires_grad_()
            out = wrap(block, x, r)
            grads.append(torch.autograd.grad(out.sum(), (x, r, w, b)))
        for got, want in zip(*grads):
            assert torch.equal(got, want), f"call {i}"


def test_native_errors(ext, backend, device, fresh):
    """What PyTorch refuses for a Python autograd.Function, the native grad_fn refuses too."""
    if not backend.runs_triton:
        pytest.skip("no kernel route on this backend: nothing is recorded natively")
    x, w, y, s = _native_call(device)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.sum().backward()
    x, w, y, s = _native_call(device)
    with torch.no_grad():
        w.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    x, w, y, s = _native_call(device)
    dy = torch.ones_like(y).requires_grad_()  # a gradient that is itself differentiated
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(y, x, dy, create_graph=True)
    x, w, y, s = _native_call(device)
    (gx,) = torch.autograd.grad((y * 0).sum() + s.sum(), x)  # a zero dy and a ds: still x's gradient
    torch.testing.assert_close(gx, torch.ones_like(gx))


# -- enable()'s add / add_ overrides registered from C++ ---------------------------------------
def _routed_device(monkeypatch):
    """(device, dispatch key) the native overrides are tested on: cuda where a GPU is present,
    else cpu tensors with the interpreter as the process's backend (as XKERNELS_BACKEND would)."""
    from helpers import require_interpreter
    from xkernels import dispatch

    if torch.cuda.is_available():
        return torch.device("cuda"), "CUDA"
    require_interpreter()
    monkeypatch.setattr(dispatch, "_env_backend", "interpreter")
    return torch.device("cpu"), "CPU"


@pytest.fixture
def routed_add(ext, monkeypatch):
    """``enable(ops=["add"])`` with the add override registered from C++: on cuda where a GPU is
    present (launch records), else on cpu tensors with the interpreter as the process's backend
    (as ``XKERNELS_BACKEND=interpreter``: no ``use_backend`` block, during which the C++ override
    defers to Python). Yields (the float32 calls the Python override saw, the device, the
    dispatch key); results NaN-poisoned before each native launch."""
    import xkernels
    from xkernels import routing
    from xkernels.ops.elementwise.add import add as add_op

    device, key = _routed_device(monkeypatch)
    monkeypatch.setattr(routing, "_parked", {})  # no signatures kept from another test's overrides
    add_op._forget()
    routing._ADD_SIGNATURES.clear()
    seen = []
    real = routing._add_repeat
    # the float32 calls the Python override saw (the float64 references go there too, to aten)
    monkeypatch.setattr(routing, "_add_repeat",
                        lambda *a: (a[2][0].dtype == torch.float32 and seen.append(a[0])) or real(*a))
    ext.set_poison(True)
    xkernels.enable(ops=["add"])
    routing.routing_counts(reset=True)
    try:
        assert isinstance(routing._libraries[("add.Tensor", key)], routing._NativeOverride)
        yield seen, device, key
    finally:
        xkernels.disable()
        ext.set_poison(False)
        add_op._forget()


def test_native_add_override_launches_repeats_without_python(routed_add):
    from xkernels import routing

    seen, device, key = routed_add
    for _ in range(3):  # fresh data, one signature
        x, y = torch.randn(5, 33, device=device), torch.randn(5, 33, device=device)
        with Unchanged(x, y):
            got = x + y
        assert torch.equal(got, (x.double() + y.double()).float())
    assert seen == ["add.Tensor"], "the repeats went to the Python override"
    # float32 runs xkernels' kernel; the float64 references' signature, aten's kernel from C++
    assert routing._natives[("add.Tensor", key)].entries == 2
    assert routing.routing_counts()["add.Tensor"] == {"xkernels": 3, "aten: dtype torch.float64": 3}


def test_native_add_override_defers_what_it_does_not_cover(routed_add):
    """Other alpha, broadcasting, dtypes, strides, shapes, a use_backend block: the Python
    override decides (and its counts say how); each result against torch's."""
    import xkernels
    from xkernels import routing

    seen, device, key = routed_add
    x, y = torch.randn(4, 16, device=device), torch.randn(4, 16, device=device)
    for _ in range(2):
        x + y  # remembered
    n = len(seen)
    cases = [lambda: torch.add(x, y, alpha=2), lambda: x + y[0], lambda: x + y.double(), lambda: x.t() + y.t(),
             lambda: x[:2] + y[:2], lambda: x + 1.5]
    for case in cases:
        got = case()
        routing.disable()
        want = case()
        xkernels.enable(ops=["add"])
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6) and got.dtype == want.dtype and got.shape == want.shape
    with xkernels.use_backend(xkernels.dispatch.select(device).name):
        torch.testing.assert_close(x + y, (x.double() + y.double()).float(), rtol=0, atol=0)
    assert len(seen) >= n + 4  # alpha and the scalar operand skip _add_repeat; the rest went to Python


@pytest.fixture
def add_calls(routed_add, monkeypatch):
    """``routed_add``, and a list of the calls that reached the Python overrides (``_add`` /
    ``_add_`` as the C++ overrides call them): (overload, other's kind, alpha). References and
    comparisons add too: tests count the calls of the statement under test only."""
    import xkernels
    from xkernels import routing

    calls = []
    xkernels.disable()  # register again, with counting Python overrides the C++ ones call
    for name in ("add.Tensor", "add_.Tensor"):
        real = routing._OVERRIDES[name]
        monkeypatch.setitem(routing._OVERRIDES, name, lambda x, y, *, alpha=1, real=real, name=name: (
            calls.append((name, type(y).__name__, alpha)) or real(x, y, alpha=alpha)))
    xkernels.enable(ops=["add"])
    routing.routing_counts(reset=True)
    return calls, routed_add[1]


def test_native_add_override_runs_every_form_from_cpp(add_calls):
    """Broadcasting, a number operand (each value its own signature), alpha, in place: after
    the first call of a signature (the Python override decides and hands it over), every
    repeat runs from C++; each result against float64, inputs unchanged, results NaN-poisoned
    before each launch."""
    from xkernels import routing

    calls, device = add_calls
    x0 = torch.randn(4, 3, 16, device=device)
    b0 = torch.randn(16, device=device)
    cases = [
        ("broadcast", lambda x, b: x + b, lambda x, b: x + b),
        ("number", lambda x, b: x + 1.5, lambda x, b: x + 1.5),
        ("another number", lambda x, b: x + 2.5, lambda x, b: x + 2.5),  # not the 1.5 entry's launch
        ("reflected number", lambda x, b: 1.0 + x, lambda x, b: x + 1.0),
        ("int number", lambda x, b: x + 3, lambda x, b: x + 3),
        ("alpha", lambda x, b: torch.add(x, x.flip(0), alpha=0.5), lambda x, b: x + 0.5 * x.flip(0)),
    ]
    for label, fn, ref in cases:
        made = []
        for _ in range(3):
            x, b = torch.randn_like(x0), torch.randn_like(b0)
            n = len(calls)
            with Unchanged(x, b):
                got = fn(x, b)
            made += calls[n:]
            want = ref(x.double(), b.double()).float()
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=label)
            assert got.dtype == torch.float32 and got.shape == want.shape, label
        assert len(made) == 1, (label, made)  # the first call only
    made = []
    for _ in range(3):  # in place, a broadcast operand
        x, b = torch.randn_like(x0), torch.randn_like(b0)
        want = (x.double() + b.double()).float()
        n = len(calls)
        x.add_(b)
        made += calls[n:]
        torch.testing.assert_close(x, want, rtol=1e-6, atol=1e-6)
    assert made == [("add_.Tensor", "Tensor", 1)]
    counts = routing.routing_counts()
    assert counts["add.Tensor"]["xkernels"] >= 18 and counts["add_.Tensor"] == {"xkernels": 3}, counts


def test_native_add_override_runs_aten_decisions_from_cpp(add_calls):
    """Signatures the Python override leaves to aten (a non-contiguous operand, float64, mixed
    dtypes, a number that promotes): their repeats call aten's kernel from C++, counted under
    the Python override's reason, with aten's result dtype, strides and values."""
    from xkernels import routing

    calls, device = add_calls
    x0 = torch.randn(6, 8, device=device)
    cases = [  # (each case's call is spelled out below too, its operands made beforehand)
        ("non-contiguous", lambda x: x.t() + x.t(), "aten: non-contiguous operand"),
        ("uint8", lambda x: x.to(torch.uint8) + x.to(torch.uint8), "aten: dtype torch.uint8"),
        ("mixed dtypes", lambda x: x.half() + x, "aten: mixed dtypes"),
        ("promoting number", lambda x: x.int() + 1.5, "aten: scalar promotes the dtype"),
    ]
    for label, fn, why in cases:
        inputs = [torch.randn_like(x0) for _ in range(3)]
        routing.disable()
        wants = [fn(x) for x in inputs]  # aten's own
        routing.enable(ops=["add"])  # an empty C++ table: the first call teaches it
        routing.routing_counts(reset=True)
        made = []
        for x, want in zip(inputs, wants):
            a, b = {"non-contiguous": (x.t(), x.t()), "uint8": (x.to(torch.uint8),) * 2,
                    "mixed dtypes": (x.half(), x), "promoting number": (x.int(), 1.5)}[label]
            n = len(calls)
            got = a + b
            made += calls[n:]
            assert got.dtype == want.dtype and got.stride() == want.stride() and torch.equal(got, want), label
        counts = routing.routing_counts(reset=True)["add.Tensor"]
        assert counts == {why: 3} and len(made) == 1, (label, counts, made)
    y = torch.randn(8, 6, device=device)
    made = []
    for _ in range(3):  # in place, a non-contiguous operand
        x = torch.randn_like(x0)
        want = (x.double() + y.t().double()).float()
        n = len(calls)
        x.add_(y.t())
        made += calls[n:]
        torch.testing.assert_close(x, want, rtol=0, atol=1e-6)
    assert made == [("add_.Tensor", "Tensor", 1)]
    assert routing.routing_counts()["add_.Tensor"] == {"aten: non-contiguous operand": 3}


def test_native_add_inplace_override(routed_add):
    from xkernels import routing

    seen, device, key = routed_add
    y = torch.randn(3, 24, device=device)
    for _ in range(3):
        x = torch.randn(3, 24, device=device)
        want = (x.double() + y.double()).float()
        x.add_(y)
        assert torch.equal(x, want)
    x = torch.randn(3, 24, device=device)
    want = (2 * x.double()).float()
    x.add_(x)  # self as the other operand: allowed
    assert torch.equal(x, want)
    assert seen.count("add_.Tensor") == 1
    assert routing.routing_counts()["add_.Tensor"]["xkernels"] == 4


def test_native_add_override_removed_and_registered_again(routed_add):
    import xkernels
    from xkernels import routing

    seen, device, key = routed_add
    x, y = torch.randn(8, device=device), torch.randn(8, device=device)
    for _ in range(2):
        x + y
    xkernels.disable()
    assert routing._natives == {} and routing.enabled_ops() == {}
    assert torch.equal(x + y, torch.ops.aten.add.out(x, y, out=torch.empty(8, device=device)))  # aten's kernel
    xkernels.enable(ops=["add"])  # registers the same override again (the C++ slot was freed), its table kept
    assert isinstance(routing._libraries[("add.Tensor", key)], routing._NativeOverride)
    n = len(seen)
    for _ in range(3):
        torch.testing.assert_close(x + y, (x.double() + y.double()).float(), rtol=0, atol=0)
    assert len(seen) == n, "the override registered again went back to Python for a signature it had learnt"
    # a plugin registering while the override is removed: the kept table is cleared too
    xkernels.disable()
    routing._forget_native()
    xkernels.enable(ops=["add"])
    for _ in range(3):
        torch.testing.assert_close(x + y, (x.double() + y.double()).float(), rtol=0, atol=0)
    assert len(seen) == n + 1, "the Python repeat did not teach the cleared override its signature"


def test_a_threads_view_of_the_overrides_follows_every_change(routed_add):
    """Each thread finds its override and remembered entries in its own view, with no lock: a
    table cleared, or an override removed and registered again, by another thread is seen at
    that thread's next call (it asks the Python override again), never run from a stale view."""
    import queue
    import threading

    import xkernels
    from xkernels import routing

    seen, device, key = routed_add
    x, y = torch.randn(8, device=device), torch.randn(8, device=device)
    want = (x.double() + y.double()).float()
    jobs: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()

    def worker():  # one thread for the whole test: its view lives between the steps
        while (n := jobs.get()) is not None:
            try:
                done.put([x + y for _ in range(n)])
            except Exception as exc:  # noqa: BLE001 - handed to the test's thread
                done.put(exc)

    def on_worker(n):
        jobs.put(n)
        got = done.get(timeout=60)
        assert not isinstance(got, Exception), got
        for out in got:
            torch.testing.assert_close(out, want, rtol=0, atol=0)
        return len(seen)

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    try:
        learned = on_worker(3)  # the worker's first calls teach the table; its view keeps the entry
        assert on_worker(3) == learned, "repeats went to the Python override"
        routing._natives[("add.Tensor", key)].clear()
        assert on_worker(1) == learned + 1, "a cleared entry ran from the worker's view"
        assert on_worker(3) == learned + 1
        xkernels.disable()
        on_worker(2)  # aten's own kernel
        handle, _ = routing._parked[("add.Tensor", key)]
        assert handle.take_hits() == (0, {}), "the removed override ran from the worker's view"
        xkernels.enable(ops=["add"])  # the same override again, with the signature it learnt
        assert on_worker(3) == learned + 1, "the override registered again lost its signatures"
        assert handle.take_hits()[0] == 3
    finally:
        jobs.put(None)
        t.join(timeout=60)


@pytest.fixture
def routed_matmul(ext, monkeypatch):
    """``enable(ops=["matmul", "linear"])`` with every matmul/linear route the device's BLAS, the
    overrides registered from C++ (cuda where present, else cpu tensors with the interpreter as
    the process's backend); yields (the Python ``_repeat`` calls, the device)."""
    import xkernels
    from helpers import every_matmul_to_vendor
    from xkernels import routing

    device, key = _routed_device(monkeypatch)
    monkeypatch.setattr(routing, "_parked", {})  # no signatures kept from another test's overrides
    seen = []
    real = routing._repeat
    monkeypatch.setattr(routing, "_repeat",  # the user's calls the Python override saw (not re-entrant ones)
                        lambda name, *a, **k: (routing._thread.inside or seen.append(name)) and None
                        or real(name, *a, **k))
    ext.set_poison(True)
    with every_matmul_to_vendor(monkeypatch):
        xkernels.enable(ops=["matmul", "linear"])
        routing.routing_counts(reset=True)
        try:
            for name in ("mm", "bmm", "addmm"):
                assert isinstance(routing._libraries[(name, key)], routing._NativeOverride)
            yield seen, device
        finally:
            xkernels.disable()
            ext.set_poison(False)


def test_native_matmul_overrides_call_aten_out_from_cpp(routed_matmul):
    """A signature whose route is the device's BLAS: the first call runs the op, the second is
    the Python override's repeat (which hands the signature to C++), the rest run aten's .out
    kernel from C++; every result against aten's own, every call counted."""
    from xkernels import routing

    seen, device = routed_matmul
    a, b, bias = (torch.randn(6, 5, device=device), torch.randn(5, 7, device=device),
                  torch.randn(7, device=device))
    a3, b3 = torch.randn(2, 6, 5, device=device), torch.randn(2, 5, 7, device=device)
    for _ in range(4):
        for got, want in ((a @ b, torch.ops.aten.mm.out(a, b, out=torch.empty(0, device=device))),
                          (torch.bmm(a3, b3), torch.ops.aten.bmm.out(a3, b3, out=torch.empty(0, device=device))),
                          (torch.addmm(bias, a, b),
                           torch.ops.aten.addmm.out(bias, a, b, out=torch.empty(0, device=device)))):
            assert got.shape == want.shape and got.is_contiguous() and not torch.isnan(got).any()
            torch.testing.assert_close(got, want)
    # per op: the first call (no route yet) and the second (the repeat that hands over) in Python
    assert sorted(seen) == ["addmm", "addmm", "bmm", "bmm", "mm", "mm"], seen
    counts = routing.routing_counts()
    for name in ("mm", "bmm", "addmm"):
        assert counts[name][routing.VENDOR_WHY] == 3, (name, counts)
    # another layout of the same shapes: not the remembered signature, Python decides
    bt = torch.randn(7, 5, device=device).t()
    torch.testing.assert_close(a @ bt, torch.ops.aten.mm.out(a, bt, out=torch.empty(0, device=device)))
    assert seen.count("mm") == 3
    # a plugin registering (its tables may change routes): the C++ overrides forget what they hold
    from xkernels.registry import registry

    for listener in registry.listeners:
        if getattr(listener, "__name__", "") == "_forget_native":
            listener()
    assert all(h.entries == 0 for h in routing._natives.values())
    # addmm with beta != 1: never from C++
    torch.testing.assert_close(torch.addmm(bias, a, b, beta=0.5),
                               torch.ops.aten.addmm.out(bias, a, b, beta=0.5, out=torch.empty(0, device=device)))
    assert all(h.entries == 0 for h in routing._natives.values())


def test_native_matmul_overrides_run_aten_decisions_from_cpp(routed_matmul):
    """A signature the Python override leaves to aten (float64 here): its repeats call aten's
    .out kernel from C++, counted under the Python override's reason."""
    from xkernels import routing

    seen, device = routed_matmul
    routing.routing_counts(reset=True)
    a, b, bias = (torch.randn(6, 5, device=device, dtype=torch.float64),
                  torch.randn(5, 7, device=device, dtype=torch.float64), torch.randn(7, device=device, dtype=torch.float64))
    for _ in range(3):  # against aten's .out kernels (never overridden)
        assert torch.equal(a @ b, torch.ops.aten.mm.out(a, b, out=torch.empty(0, device=device, dtype=a.dtype)))
        assert torch.equal(torch.addmm(bias, a, b),
                           torch.ops.aten.addmm.out(bias, a, b, out=torch.empty(0, device=device, dtype=a.dtype)))
    counts = routing.routing_counts()
    assert counts["mm"] == {"aten: dtype torch.float64": 3} and counts["addmm"] == {"aten: dtype torch.float64": 3}
    # the first call of each went through the Python override (whose _repeat found no route)
    assert sorted(seen) == ["addmm", "mm"], seen


def test_enable_records_linear_training_calls_as_one_node(routed_matmul):
    """Under ``enable(ops=["linear"])`` with the extension loaded, ``F.linear``'s training calls
    are recorded as one grad_fn (aten::linear's C++ kernel on the Autograd key), their addmm / mm
    still routed: outputs and every gradient bit-equal to torch's own (the routes here are the
    device's BLAS), counted; a call outside what the node covers (no gradient, a non-contiguous
    input, saved-tensor hooks) runs aten's composite kernel, and disable() restores it."""
    import xkernels
    from xkernels import routing

    seen, device = routed_matmul
    key = "CUDA" if device.type == "cuda" else "CPU"
    assert isinstance(routing._libraries[("linear", key)], routing._NativeOverride)
    routing.routing_counts(reset=True)
    for shape in ((6, 5), (2, 3, 5)):
        for _ in range(3):
            x = torch.randn(shape, device=device, requires_grad=True)
            w = torch.randn(7, 5, device=device, requires_grad=True)
            b = torch.randn(7, device=device, requires_grad=True)
            y = torch.nn.functional.linear(x, w, b)
            assert y.grad_fn.name() == "xkernels::LinearBackward"
            dy = torch.randn_like(y)
            got = torch.autograd.grad(y, (x, w, b), dy)
            # PyTorch's graph of the same call: at::linear's decomposition, recorded by autograd
            xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
            yr = torch.addmm(br, xr.reshape(-1, 5), wr.t()).view(*shape[:-1], 7)
            assert yr.grad_fn.name() == "ViewBackward0" or yr.grad_fn.name() == "AddmmBackward0"
            want = torch.autograd.grad(yr, (xr, wr, br), dy)
            assert torch.equal(y, yr)
            for g, e in zip(got, want):
                assert torch.equal(g, e)
    counts = routing.routing_counts()
    assert counts["linear"] == {"one grad_fn (xkernels::LinearBackward)": 6}, counts
    x, w = torch.randn(5, 6, device=device).t().requires_grad_(), torch.randn(7, 5, device=device)
    assert torch.nn.functional.linear(x, w).grad_fn.name() != "xkernels::LinearBackward"  # not contiguous
    with torch.no_grad():
        assert torch.nn.functional.linear(x, w).grad_fn is None
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        y = torch.nn.functional.linear(x.detach().contiguous().requires_grad_(), w)
        assert y.grad_fn.name() != "xkernels::LinearBackward"
    xkernels.disable()
    x = torch.randn(6, 5, device=device, requires_grad=True)
    assert torch.nn.functional.linear(x, torch.randn(7, 5, device=device)).grad_fn.name() != "xkernels::LinearBackward"


def test_enabled_linear_and_matmul_shortcuts_keep_atens_results_and_errors(routed_matmul):
    """With nothing to record, a 2-D (or contiguous 3-D with a bias) ``F.linear`` and a 2-D @ 2-D
    matmul go straight to the addmm / mm override; every other form (a non-contiguous or 4-D input,
    a 2-D bias) runs aten's decomposition, and mixed dtypes raise aten's own error."""
    import xkernels

    seen, device = routed_matmul
    r = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    w, b = r(7, 5), r(7)
    forms = {"3-D strided": lambda: torch.nn.functional.linear(r(3, 2, 5).transpose(0, 1), w, b),
             "4-D": lambda: torch.nn.functional.linear(r(2, 2, 3, 5), w, b),
             "2-D bias": lambda: torch.nn.functional.linear(r(4, 5), w, r(4, 7)),
             "3-D no bias": lambda: torch.nn.functional.linear(r(2, 3, 5), w),
             "matmul 2-D @ 1-D": lambda: r(4, 5) @ r(5)}
    for name, form in forms.items():
        torch.manual_seed(3)
        got = form()
        xkernels.disable()
        try:
            torch.manual_seed(3)
            want = form()
        finally:
            xkernels.enable(ops=["matmul", "linear"])
        assert torch.equal(got, want), name
    xd = r(4, 5).double()
    for call in (lambda: torch.nn.functional.linear(xd, w, b), lambda: torch.nn.functional.linear(xd, w),
                 lambda: xd @ w.t()):
        with pytest.raises(RuntimeError, match="dtype|Double|Float"):
            call()


def test_enable_runs_linear_and_matmul_with_nothing_to_record_below_autograd(routed_matmul):
    """``F.linear`` and ``torch.matmul`` calls with nothing for autograd to record (no_grad, or no
    tensor requiring grad) run aten's decomposition below autograd from the Autograd-key kernels
    (their addmm / mm / bmm still routed and counted): results equal aten's own, nothing
    recorded. A forward-mode tangent, a tensor requiring grad and a dispatch mode keep aten's
    composite kernel, whose tangents, graphs and mode calls are then PyTorch's."""
    import torch.autograd.forward_ad as fwAD
    from torch.utils._python_dispatch import TorchDispatchMode

    import xkernels
    from xkernels import routing

    seen, device = routed_matmul
    key = "CUDA" if device.type == "cuda" else "CPU"
    for name in ("linear", "matmul"):
        assert isinstance(routing._libraries[(name, key)], routing._NativeOverride), name
    x2, x3, w, b = (torch.randn(6, 5, device=device), torch.randn(2, 3, 5, device=device),
                    torch.randn(7, 5, device=device), torch.randn(7, device=device))
    a3, b3 = torch.randn(2, 6, 5, device=device), torch.randn(2, 5, 7, device=device)
    out = torch.empty(0, device=device)
    want = {"linear 2-D": torch.ops.aten.addmm.out(b, x2, w.t(), out=out.clone()),
            "linear 3-D": torch.ops.aten.addmm.out(b, x3.view(6, 5), w.t(), out=out.clone()).view(2, 3, 7),
            "linear no bias": torch.ops.aten.mm.out(x2, w.t(), out=out.clone()),
            "matmul 2-D": torch.ops.aten.mm.out(x2, w.t(), out=out.clone()),
            "matmul 3-D": torch.ops.aten.bmm.out(a3, b3, out=out.clone())}
    calls = {"linear 2-D": lambda: torch.nn.functional.linear(x2, w, b),
             "linear 3-D": lambda: torch.nn.functional.linear(x3, w, b),
             "linear no bias": lambda: torch.nn.functional.linear(x2, w),
             "matmul 2-D": lambda: x2 @ w.t(), "matmul 3-D": lambda: torch.matmul(a3, b3)}
    routing.routing_counts(reset=True)
    for grad_mode in (False, True):
        with torch.set_grad_enabled(grad_mode):
            for _ in range(3):
                for name, call in calls.items():
                    got = call()
                    assert torch.equal(got, want[name]) and got.grad_fn is None and not got.requires_grad, name
    counts = routing.routing_counts()
    # every product counted once by its override: 12 addmm (2-D and 3-D fold alike), 12 mm, 6 bmm;
    # each signature's first call ran the op (counted "xkernels"), whose aten call came back
    for name, n in (("addmm", 12), ("mm", 12), ("bmm", 6)):
        assert counts[name] == {"xkernels": 1, "aten: re-entrant call": 1, routing.VENDOR_WHY: n - 1}, counts
    assert "linear" not in counts, counts  # no grad_fn recorded
    # a tensor requiring grad (not what the one-node covers: no bias here, one input row) -> aten's nodes
    wg = w.clone().requires_grad_()
    assert torch.nn.functional.linear(x2[:1], wg).grad_fn.name() != "xkernels::LinearBackward"
    assert (x2 @ wg.t()).grad_fn is not None
    # forward-mode tangents: PyTorch's own
    tangent = torch.randn_like(x2)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x2, tangent)
        for got, t_want in ((torch.nn.functional.linear(dual, w, b), tangent @ w.t()), (dual @ w.t(), tangent @ w.t())):
            torch.testing.assert_close(fwAD.unpack_dual(got).tangent, t_want)

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Seen() as mode:  # a mode sees aten's decomposition, as without xkernels
        assert torch.equal(torch.nn.functional.linear(x2, w, b), want["linear 2-D"])
        assert torch.equal(x2 @ w.t(), want["matmul 2-D"])
    assert any("addmm" in o for o in mode.ops) and any(o.startswith("aten.mm") for o in mode.ops), mode.ops
    xkernels.disable()
    assert ("matmul", key) not in routing._libraries and torch.equal(x2 @ w.t(), want["matmul 2-D"])
