"""gated_linear(x, weight, up_weight, bias, up_bias, activation): act(x @ Wg.T + bg) * (x @ Wu.T + bu)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch

import xkernels
from helpers import TMA_FORM_IDS, TMA_FORMS, Unchanged, rand
from xkernels import tuning
from xkernels.ops import gated_linear
from xkernels.ops.fused import gated_linear_hot, gated_linear_plan
from xkernels.ops.fused.gated_linear import ACTIVATIONS, reference_gated_linear
from xkernels.ops.route import KernelRoute, VendorRoute

F = torch.nn.functional
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
#: relative bound on |error| / magnitude (see _assert_gated_close): a few roundings of the dtype
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5, torch.float64: 1e-12}
SLOPE = 1.13  # the activations' largest |f'| (xkernels/harness/tolerances.py ACTIVATION_SLOPE)


def _act(v, activation):
    return {"relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
            "silu": F.silu, "quick_gelu": lambda t: t * torch.sigmoid(1.702 * t),
            "relu2": lambda t: torch.relu(t).square()}[activation](v)


def _args(device, dtype, m=5, k=37, n=19, lead=(), concat=False, biases=True):
    """Fresh random (x, weight, up_weight, bias, up_bias) in the form the call takes."""
    x = rand((*lead, m, k), dtype, device)
    wg, wu = rand((n, k), dtype, device), rand((n, k), dtype, device)
    bg, bu = (rand((n,), dtype, device), rand((n,), dtype, device)) if biases else (None, None)
    if concat:
        return x, torch.cat([wg, wu]), None, None if bg is None else torch.cat([bg, bu]), None
    return x, wg, wu, bg, bu


def _split(weight, up_weight, bias, up_bias):
    if up_weight is not None:
        return weight, up_weight, bias, up_bias
    n = weight.shape[0] // 2
    return weight[:n], weight[n:], None if bias is None else bias[:n], None if bias is None else bias[n:]


def _assert_gated_close(got, x, weight, up_weight, bias, up_bias, activation, dtype):
    """``got`` against the float64 composition, element-wise: |err| <= rtol * (|ref| + the error
    magnitude of a product of two inner products, |act(g)| * (|x| @ |Wu|.T + |bu|) + L * |u| *
    (|x| @ |Wg|.T + |bg|)); L the activation's largest slope, relu2's 2 relu(g) <= 2 (|x| @ |Wg|.T + |bg|))."""
    wg, wu, bg, bu = (None if t is None else t.detach().cpu().double() for t in _split(weight, up_weight, bias, up_bias))
    x64 = x.detach().cpu().double()
    g, u = F.linear(x64, wg, bg), F.linear(x64, wu, bu)
    ref = _act(g, activation) * u
    mag_g = F.linear(x64.abs(), wg.abs(), None if bg is None else bg.abs())
    mag_u = F.linear(x64.abs(), wu.abs(), None if bu is None else bu.abs())
    slope = 2 * mag_g if activation == "relu2" else SLOPE
    mag = ref.abs() + _act(g, activation).abs() * mag_u + slope * u.abs() * mag_g
    assert got.shape == ref.shape and got.dtype == dtype, (got.shape, got.dtype, ref.shape, dtype)
    err = (got.detach().cpu().double() - ref).abs()
    assert not torch.isnan(err).any(), "NaN in the result (an element not written?)"
    bound = RTOL[dtype] * mag + 1e-5
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"error {worst:.2f}x the bound; max |err| {err.max().item():.3g}"


@pytest.fixture
def nan_memory(monkeypatch):
    """Every allocation of the plans (output, kept gate and up) and of the routes starts as NaN."""
    monkeypatch.setattr(gated_linear_plan, "_empty",
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))
    monkeypatch.setattr(gated_linear_hot, "allocator", lambda backend, device: lambda size, stride, dtype: torch.full(
        size, float("nan"), dtype=dtype, device=device))
    gated_linear._forget()
    yield
    gated_linear._forget()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("concat", [False, True], ids=["separate", "concatenated"])
@pytest.mark.parametrize("biases", [False, True], ids=["no bias", "biases"])
def test_forward_matches_float64(backend, device, nan_memory, dtype, concat, biases):
    args = _args(device, dtype, concat=concat, biases=biases)
    for activation in ACTIVATIONS:
        with Unchanged(*args):
            got = gated_linear(*args, activation=activation)
        _assert_gated_close(got, *args, activation, dtype)


@pytest.mark.parametrize("concat", [False, True], ids=["separate", "concatenated"])
def test_vendor_route(backend, device, nan_memory, concat):
    """The BLAS GEMM(s) + gate kernel route, as a table rule ``{"VENDOR": true}`` picks it."""
    args = _args(device, torch.float32, concat=concat)
    with tuning.force({"VENDOR": True}):
        expl = gated_linear.explain(*args, activation="gelu")
        with Unchanged(*args):
            got = gated_linear(*args, activation="gelu")
    _assert_gated_close(got, *args, "gelu", torch.float32)
    if backend.runs_triton:
        assert expl.route == "vendor BLAS + gate kernel"
        assert ("one F.linear" if concat else "two F.linear") in expl.variant


def test_one_bias_only_and_keywords(backend, device):
    x, wg, wu, bg, bu = _args(device, torch.float32)
    _assert_gated_close(gated_linear(x, wg, wu, bg), x, wg, wu, bg, None, "silu", torch.float32)
    _assert_gated_close(gated_linear(x, wg, up_weight=wu, up_bias=bu, activation="relu"), x, wg, wu, None, bu,
                        "relu", torch.float32)


def test_layouts(backend, device, nan_memory):
    """Non-contiguous x (transposed, step-sliced), batched 3-D and 1-D x, a transposed-view
    weight, a step-sliced bias."""
    d = torch.float32
    x, wg, wu, bg, bu = _args(device, d, m=6, k=20, n=10)
    cases = [
        (rand((20, 6), d, device).t(), wg, wu, bg, bu),                       # x transposed
        (rand((6, 40), d, device)[:, ::2], wg, wu, bg, bu),                   # x step-sliced
        (rand((2, 3, 20), d, device), wg, wu, bg, bu),                        # batched x
        (rand((3, 20, 2), d, device).permute(2, 0, 1), wg, wu, bg, bu),       # batched, not foldable
        (rand((20,), d, device), wg, wu, bg, bu),                             # 1-D x
        (x, rand((20, 10), d, device).t(), wu, bg, bu),                       # weight a transposed view
        (x, wg, wu, rand((20,), d, device)[::2], bu),                         # bias step-sliced
        (x, rand((40, 20), d, device)[::2], None, None, None),                # concatenated weight, strided rows
    ]
    for args in cases:
        with Unchanged(*args):
            got = gated_linear(*args)
        assert got.shape == (*args[0].shape[:-1], 10 if args[2] is not None else args[1].shape[0] // 2)
        _assert_gated_close(got, *args, "silu", d)


def test_empty_and_zero_k(backend, device):
    d = torch.float32
    for x, w in (((0, 8), (6, 8)), ((4, 8), (0, 8)), ((2, 0, 8), (6, 8)), ((4, 0), (6, 0))):
        x, w = rand(x, d, device), rand(w, d, device)
        b = rand((w.shape[0],), d, device)
        got = gated_linear(x, w, bias=b)
        want = reference_gated_linear(x.double().cpu(), w.double().cpu(), bias=b.double().cpu())
        assert got.shape == want.shape
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)


def test_float64_runs_pytorch(backend, device):
    args = _args(device, torch.float64)
    expl = gated_linear.explain(*args)
    assert expl.route == "torch"
    _assert_gated_close(gated_linear(*args), *args, "silu", torch.float64)


def _bad(device):
    x, wg, wu, bg, bu = _args(device, torch.float32, m=3, k=8, n=6)
    cat = torch.cat([wg, wu])
    return [
        ((x, wg, wu[:5]), {}, ValueError, r"'weight' and 'up_weight' must have one shape .*\(6, 8\) and \(5, 8\)"),
        ((x, wg[:, :7], wu[:, :7]), {}, ValueError, r"'x' \(3, 8\) has 8 features, 'weight' \(6, 7\) expects 7"),
        ((x, cat[:11]), {}, ValueError, r"rows must be even; got shape \(11, 8\)"),
        ((x, wg, wu, bg[:5]), {}, ValueError, r"'bias' must have shape \(6,\) .* got \(5,\)"),
        ((x, cat, None, bg), {}, ValueError, r"'bias' must have shape \(12,\) for the concatenated"),
        ((x, wg, wu, None, bu[:4]), {}, ValueError, r"'up_bias' must have shape \(6,\) .* got \(4,\)"),
        ((x, cat, None, None, bu), {}, ValueError, r"'up_bias' needs 'up_weight'"),
        ((x, wg, wu), {"activation": "tanh"}, ValueError, r"'activation' must be one of .* got 'tanh'"),
        ((x, wg, wu), {"activation": None}, ValueError, r"'activation' must be one of"),
        ((x, wg, wu.half()), {}, TypeError, r"one dtype, got 'x' torch.float32, 'weight' torch.float32, "
                                            r"'up_weight' torch.float16"),
        ((x.int(), wg.int(), wu.int()), {}, TypeError, r"dtype torch.int32 is not supported"),
        ((x, wg, wu, bg.meta if False else bg.to("meta")), {}, ValueError, r"one device, .*'bias' on meta"),
        ((x, wg[0], wu[0]), {}, ValueError, r"'weight' must be 2-D, got shape \(8,\)"),
        ((x, wg, [1.0]), {}, TypeError, r"'up_weight' must be a torch.Tensor"),
        ((x[0, 0], wg, wu), {}, ValueError, r"'x' must have at least 1 dimension"),
    ]


def test_bad_input_raises_before_anything_runs(backend, device, monkeypatch):
    launched = []
    monkeypatch.setattr(gated_linear_plan.GatedPlan, "run", lambda self, call: launched.append(call))
    for args, kwargs, exc, match in _bad(device):
        with pytest.raises(exc, match=match):
            gated_linear(*args, **kwargs)
        with pytest.raises(exc, match=match):  # the same check where a gradient is required
            gated_linear(*[a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                           and a.device.type != "meta" else a for a in args], **kwargs)
    assert not launched


# -- gradients ----------------------------------------------------------------------------------
def _grads(fn, args, dy):
    leaves = [a.detach().clone().requires_grad_() if a is not None else None for a in args]
    y = fn(*leaves)
    y.backward(dy)
    return y.detach(), [None if a is None else a.grad for a in leaves]


@pytest.mark.parametrize("route", ["planned", "vendor"])
@pytest.mark.parametrize("concat", [False, True], ids=["separate", "concatenated"])
def test_gradients_match_float64(backend, device, nan_memory, concat, route):
    d = torch.float32
    args = _args(device, d, m=4, k=12, n=6, lead=(2,), concat=concat)
    dy = rand((2, 4, 6), d, device)
    for activation in ACTIVATIONS:
        mine = lambda *a: gated_linear(*a, activation=activation)  # noqa: E731
        ref_fn = lambda *a: reference_gated_linear(*a, activation=activation)  # noqa: E731
        if route == "vendor":
            with tuning.force({"VENDOR": True}):
                y, grads = _grads(mine, args, dy)
        else:
            y, grads = _grads(mine, args, dy)
        y64, ref = _grads(ref_fn, [None if a is None else a.double().cpu() for a in args], dy.double().cpu())
        torch.testing.assert_close(y.cpu().double(), y64, rtol=1e-4, atol=1e-4)
        for name, g, r in zip(("x", "weight", "up_weight", "bias", "up_bias"), grads, ref):
            assert (g is None) == (r is None), name
            if g is not None:
                assert g.shape == r.shape and g.dtype == d, name
                scale = r.abs().max().item() + 1
                torch.testing.assert_close(g.cpu().double(), r, rtol=1e-4, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("concat", [False, True], ids=["separate", "concatenated"])
def test_gate_grad_kernel_matches_float64(backend, device, nan_memory, dtype, concat):
    """The backward's element-wise half in one launch: d(gate) = dy * up * act'(gate), d(up) = dy *
    act(gate), into NaN-poisoned buffers (the halves of one (M, 2I) buffer for a concatenated
    weight), from strided gate/up views (the BLAS's (M, 2I) result), for every activation, against
    float64; gate values of exactly 0 included (relu's derivative there is PyTorch's, 0)."""
    if not backend.runs_triton:
        assert gated_linear_plan.gate_grads(backend, *(rand((3, 4), dtype, device),) * 3, "silu", concat) is None
        return
    m, n = 37, 300  # two column tiles of 256, edge rows
    gu = rand((m, 2 * n), dtype, device)
    gu[:, :7] = 0
    gate, up = gu[:, :n], gu[:, n:]
    dy = rand((m, n), dtype, device)
    for activation in ACTIVATIONS:
        with Unchanged(dy, gu):
            d_gate, d_up, d = gated_linear_plan.gate_grads(backend, dy, gate, up, activation, concat)
        assert (d is not None) == concat
        if concat:
            assert d.shape == (m, 2 * n) and d_gate.data_ptr() == d.data_ptr() and d_up.data_ptr() == d[:, n:].data_ptr()
        g64, u64, dy64 = gate.double().requires_grad_(), up.double().requires_grad_(), dy.double()
        (_act(g64, activation) * u64).backward(dy64)
        for name, got, want in (("d(gate)", d_gate, g64.grad), ("d(up)", d_up, u64.grad)):
            assert got.dtype == dtype and not torch.isnan(got).any(), (activation, name)
            bound = RTOL[dtype] * (want.abs() + (dy64 * u64).abs() * SLOPE + dy64.abs()) + 1e-6
            err = (got.double() - want).abs()
            assert (err <= bound).all(), f"{activation} {name}: worst {(err / bound).max().item():.2f}x the bound"


@pytest.mark.parametrize("route", ["planned", "vendor"])
@pytest.mark.parametrize("concat", [False, True], ids=["separate", "concatenated"])
def test_training_backward_launches_the_gate_grad_kernel(backend, device, route, concat, monkeypatch):
    """Either route keeps gate and up for its backward, which takes d(gate) and d(up) from one
    ``gate_grads`` launch on a backend that runs Triton (PyTorch's ops elsewhere); a backward
    that builds a graph differentiates PyTorch's composition instead, and its second derivatives
    match float64's."""
    calls = []
    real = gated_linear_plan.gate_grads

    def counted(*a, **k):
        out = real(*a, **k)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(gated_linear_plan, "gate_grads", counted)
    monkeypatch.setattr(sys.modules[gated_linear.__module__], "gate_grads", counted)
    d = torch.float32
    args = _args(device, d, m=4, k=12, n=6, lead=(2,), concat=concat)
    cfg = {"VENDOR": True} if route == "vendor" else None
    leaves = [None if a is None else a.detach().clone().requires_grad_() for a in args]
    with tuning.force(cfg) if cfg else contextlib.nullcontext():
        y = gated_linear(*leaves, activation="silu")
        y.square().sum().backward()
    assert calls == ([True] if backend.runs_triton else []), calls
    ref = [None if a is None else a.detach().double().cpu().requires_grad_() for a in args]
    reference_gated_linear(*ref, activation="silu").square().sum().backward()
    for name, g, r in zip(("x", "weight", "up_weight", "bias", "up_bias"), leaves, ref):
        if r is not None:
            torch.testing.assert_close(g.grad.cpu().double(), r.grad, rtol=1e-4, atol=1e-5 * (r.grad.abs().max() + 1),
                                       msg=name)
    # second derivatives: d/dW of |d loss / dx|^2
    calls.clear()
    leaves = [None if a is None else a.detach().clone().requires_grad_() for a in args]
    with tuning.force(cfg) if cfg else contextlib.nullcontext():
        y = gated_linear(*leaves, activation="silu")
    gx, = torch.autograd.grad(y.square().sum(), leaves[0], create_graph=True)
    assert calls == []  # the graph-building backward: PyTorch's composition
    second = torch.autograd.grad(gx.square().sum(), leaves[1])[0]  # through y again, too
    ref = [None if a is None else a.detach().double().cpu().requires_grad_() for a in args]
    gx64, = torch.autograd.grad(reference_gated_linear(*ref, activation="silu").square().sum(), ref[0],
                                create_graph=True)
    want = torch.autograd.grad(gx64.square().sum(), ref[1])[0]
    torch.testing.assert_close(second.cpu().double(), want, rtol=1e-4, atol=1e-5 * (want.abs().max().item() + 1))


def test_gradient_of_x_only_and_bf16(backend, device):
    d = torch.bfloat16
    x, wg, wu, bg, bu = _args(device, d, m=3, k=16, n=8)
    xr = x.detach().clone().requires_grad_()
    y = gated_linear(xr, wg, wu, bg, bu)
    assert y.requires_grad and not wg.requires_grad
    y.sum().backward()
    x64 = x.double().cpu().requires_grad_()
    reference_gated_linear(x64, wg.double().cpu(), wu.double().cpu(), bg.double().cpu(), bu.double().cpu()).sum() \
        .backward()
    scale = x64.grad.abs().max().item()
    torch.testing.assert_close(xr.grad.cpu().double(), x64.grad, rtol=3e-2, atol=3e-2 * scale)
    with torch.no_grad():
        assert not gated_linear(xr, wg, wu).requires_grad


def test_compile_fullgraph(backend, device):
    torch._dynamo.reset()

    def mlp(x, wg, wu, bg, bu, wd):
        return gated_linear(x, wg, wu, bg, bu) @ wd.t() + gated_linear(x, torch.cat([wg, wu]), activation="gelu")[..., :1]

    d = torch.float32
    x, wg, wu, bg, bu = _args(device, d, m=4, k=12, n=6, lead=(2,))
    wd = rand((12, 6), d, device)
    inputs = [t.detach().clone().requires_grad_() for t in (x, wg, wu, bg, bu, wd)]
    try:
        got = torch.compile(mlp, fullgraph=True, backend="aot_eager")(*inputs)
        got.sum().backward()
        compiled = [t.grad.clone() for t in inputs]
        eager_in = [t.detach().clone().requires_grad_() for t in inputs]
        want = mlp(*eager_in)
        want.sum().backward()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-4, atol=1e-4)
    for g, e in zip(compiled, (t.grad for t in eager_in)):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4 * (e.abs().max().item() + 1))


def test_custom_op_fake_and_opcheck(backend, device):
    x, wg, wu, bg, bu = _args(device, torch.float32, m=3, k=8, n=6)
    from torch._subclasses.fake_tensor import FakeTensorMode

    cat, odd = torch.cat([wg, wu]), wg[:5]
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        out = torch.ops.xkernels.gated_linear.default(fx, mode.from_tensor(cat))
        assert out.shape == (3, 6)
        with pytest.raises(ValueError, match="rows must be even"):
            torch.ops.xkernels.gated_linear.default(fx, mode.from_tensor(odd))
    torch.library.opcheck(torch.ops.xkernels.gated_linear.default, (x, wg, wu, bg, bu, "gelu"),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


# -- planning -----------------------------------------------------------------------------------
def test_npu_table_fits_l0c():
    """Every npu rule's two fp32 accumulators fit the L0C of every SoC that reads the rule's table
    key (A2 and A3: Ascend910B; A5: Ascend950). tests/npu_compile plans them with the compiler."""
    from xkernels.backends.npu import table_keys

    root = Path(__file__).resolve().parents[3]
    socs = json.loads((root / "backends" / "npu_socs.json").read_text())["socs"]
    table = json.loads((root / "ops" / "tuning" / "npu" / "gated_linear.json").read_text())
    assert {"Ascend910B", "Ascend950"} <= set(table["archs"])
    for key, rules in table["archs"].items():
        readers = [s for s in socs if key in table_keys(s)]
        assert readers and rules, key
        l0c = min(socs[s]["l0c_bytes"] for s in readers)
        for r in rules:
            c = r["config"]
            assert 2 * c["BLOCK_M"] * c["BLOCK_N"] * 4 <= l0c, (key, r)


def test_cuda_routes_by_the_measured_rules():
    """sm90: the fused kernel inside the sweeps' envelope up to 64 tokens, bf16 and fp16 (the
    pointer kernel to 16, the TMA kernel from 17), the vendor route from 65 tokens and wherever
    nothing was measured (biases, relu, another width)."""
    from xkernels.backends.cuda import CudaBackend

    class _H100(CudaBackend):
        def arch(self, device=None):
            return "sm90"

        def compute_units(self, device=None):
            return 132

        def tensor_descriptors(self, device=None):
            return True

    meta = lambda *s: torch.empty(s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    call = gated_linear.check(meta(2048, 4096), meta(14336, 4096), meta(14336, 4096))
    plan = gated_linear.make_plan(call, _H100())
    assert plan.vendor and plan.route == "vendor BLAS + gate kernel" and "gated_linear.json [default]" in plan.source
    assert "no measurement" in plan.why
    half = lambda *s: torch.empty(s, dtype=torch.float16, device="meta")  # noqa: E731
    for m, tma in ((1, False), (16, False), (17, True), (64, True)):
        for act in ("silu", "gelu_tanh"):
            for t in (meta, half):
                for w in ((t(14336, 4096), t(14336, 4096)), (t(2 * 8192, 3072),)):
                    k = w[0].shape[1]
                    fused = gated_linear.make_plan(gated_linear.check(t(m, k), *w, activation=act), _H100())
                    assert not fused.vendor and (fused.tma is not None) == tma, (m, act, fused.config)
                    assert fused.measured and "gated_linear.json [sm90]" in fused.source, fused.source
    # 65-128 tokens: the H200 measured the vendor route ahead there (results/2026-11-28-h200-gated-linear-decode)
    unmeasured = [(meta(65, 4096), meta(14336, 4096), meta(14336, 4096)),
                  (meta(128, 4096), meta(14336, 4096), meta(14336, 4096)),
                  (meta(129, 4096), meta(14336, 4096), meta(14336, 4096)),
                  (meta(16, 4096), meta(14336, 4096), meta(14336, 4096), meta(14336), meta(14336)),
                  (meta(16, 4096), meta(4096, 4096), meta(4096, 4096)),
                  (meta(16, 8192), meta(14336, 8192), meta(14336, 8192))]
    for args in unmeasured:
        assert gated_linear.make_plan(gated_linear.check(*args), _H100()).vendor, [a.shape for a in args]
    assert gated_linear.make_plan(gated_linear.check(meta(16, 4096), meta(14336, 4096), meta(14336, 4096),
                                                     activation="relu"), _H100()).vendor
    assert gated_linear.make_plan(gated_linear.check(half(16, 4096), half(14336, 4096), half(14336, 4096),
                                                     half(14336), half(14336)), _H100()).vendor  # biases: unmeasured
    with tuning.force({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": True}):
        tma = gated_linear.make_plan(call, _H100())
        pointer = gated_linear.make_plan(gated_linear.check(meta(2048, 4095)[:, :4094], meta(64, 4094)), _H100())
    assert tma.tma is not None and tma.config["TMA"] and "TMA" in tma.variant
    assert pointer.tma is None and "TMA" not in pointer.config  # 8188-byte rows: no tensor descriptors


@pytest.mark.parametrize("cfg", TMA_FORMS, ids=TMA_FORM_IDS)
@pytest.mark.parametrize("concat", [False, True], ids=["separate", "concatenated"])
def test_tma_kernel_schedules_match_float64(tma_interpreter, nan_memory, cfg, concat):
    """The TMA kernel under each schedule option (as ``linear``'s Hopper configs set them), run by
    the interpreter with tensor descriptors on: edge tiles in M, N and K (5 x 5 tiles of 64 x 64,
    3 SMs when persistent), into NaN-poisoned buffers, inference and training (gate and up
    stored for the backward: output and every gradient against float64)."""
    d = torch.float16
    args = _args("cpu", d, m=296, k=72, n=264, concat=concat)
    with tuning.force(cfg):
        expl = gated_linear.explain(*args, activation="silu")
        with Unchanged(*args):
            got = gated_linear(*args, activation="silu")
    assert expl.route == "triton kernel" and "tensor descriptors (TMA)" in expl.variant, expl
    for flag, words in (("PERSISTENT", "persistent"), ("EPILOGUE_SUBTILE", "column halves")):
        assert (words in expl.variant) == bool(cfg.get(flag)), (flag, expl.variant)
        assert expl.config.get(flag, False) == cfg.get(flag, False), (flag, expl.config)
    _assert_gated_close(got, *args, "silu", d)
    leaves = [None if a is None else a.detach().clone().requires_grad_() for a in args]
    with tuning.force(cfg):
        y = gated_linear(*leaves, activation="gelu")
    dy = rand(y.shape, d, "cpu")
    y.backward(dy)
    ref = [None if a is None else a.detach().double().requires_grad_() for a in args]
    y64 = reference_gated_linear(*ref, activation="gelu")
    y64.backward(dy.double())
    _assert_gated_close(y, *args, "gelu", d)
    for name, g, r in zip(("x", "weight", "up_weight", "bias", "up_bias"), leaves, ref):
        if r is not None:
            scale = r.grad.abs().max().item() + 1
            torch.testing.assert_close(g.grad.double(), r.grad, rtol=2e-2, atol=2e-2 * scale, msg=name)


def test_explain_names_route_and_table(backend, device):
    x, wg, wu, bg, bu = _args(device, torch.float16, m=3, k=8, n=6)
    expl = gated_linear.explain(x, wg, wu, bg, bu, activation="gelu_tanh")
    if not backend.runs_triton:
        assert expl.route == "torch"
        return
    # the cuda table sends every call to the vendor route until a sweep measures the kernel
    kernel = backend.name != "cuda"
    assert expl.route == ("triton kernel" if kernel else "vendor BLAS + gate kernel"), expl
    assert not kernel or "gelu_tanh(gate) * up" in expl.variant
    assert expl.config_source.startswith("gated_linear.json")
    assert ("x read once" in str(expl)) if kernel else ("no measurement shows the fused kernel" in expl.why)
    assert "gate_grad_kernel" in expl.training and "with a gradient:" in str(expl)
    assert ("fused kernel also writes gate and up" if kernel else "gate and up results are kept") in expl.training


def test_export_from_ops():
    assert xkernels.ops.gated_linear is gated_linear
    assert "gated_linear" in xkernels.ops.__all__


# -- routes: repeated calls ---------------------------------------------------------------------
class _Checks:
    """Counts ``gated_linear.check`` (the full path's first step)."""

    def __init__(self, monkeypatch):
        self.n = 0
        real = gated_linear.check

        def counted(*args, **kwargs):
            self.n += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(gated_linear, "check", counted)


@pytest.fixture
def vendor(request, monkeypatch):
    """``"vendor"``: every plan takes the vendor route, as a measured table rule gives it (a forced
    config would bypass routes); ``"kernel"``: the fused kernel, as a measured rule with the
    built-in tile gives it (the cuda table's catch-all sends every call to the vendor route).
    Plans dropped around."""
    from xkernels.ops.matmul import config as matmul_config

    cfg = {"VENDOR": True} if request.param == "vendor" else dict(gated_linear_plan.GATED_DEFAULT)
    rule = matmul_config.Selection(cfg, "a test rule", "measured faster", True)
    monkeypatch.setattr(gated_linear_plan, "select", lambda *a, **k: rule)
    gated_linear._forget()
    yield request.param == "vendor"
    gated_linear._forget()


def _signatures(device):
    """(label, args, kwargs) makers of calls that differ from the first in one thing each."""
    d = torch.float32
    x = lambda *s, dt=d: rand(s, dt, device)  # noqa: E731
    return [
        ("base", lambda: ((x(5, 24), x(12, 24), x(12, 24), x(12), x(12)), {})),
        ("other m", lambda: ((x(7, 24), x(12, 24), x(12, 24), x(12), x(12)), {})),
        ("x transposed", lambda: ((x(24, 5).t(), x(12, 24), x(12, 24), x(12), x(12)), {})),
        ("3-D x", lambda: ((x(2, 5, 24), x(12, 24), x(12, 24), x(12), x(12)), {})),
        ("3-D x, leading dims not foldable", lambda: ((x(5, 24, 2).permute(2, 0, 1), x(12, 24), x(12, 24), x(12),
                                                       x(12)), {})),
        ("float16", lambda: (tuple(x(*s, dt=torch.float16) for s in ((5, 24), (12, 24), (12, 24), (12,), (12,))),
                             {})),
        ("gelu", lambda: ((x(5, 24), x(12, 24), x(12, 24), x(12), x(12)), {"activation": "gelu"})),
        ("relu, positional", lambda: ((x(5, 24), x(12, 24), x(12, 24), x(12), x(12), "relu"), {})),
        ("weight a transposed view", lambda: ((x(5, 24), x(24, 12).t(), x(12, 24), x(12), x(12)), {})),
        ("no biases", lambda: ((x(5, 24), x(12, 24), x(12, 24)), {})),
        ("up bias only", lambda: ((x(5, 24), x(12, 24), x(12, 24), None, x(12)), {})),
        ("concatenated", lambda: ((x(5, 24), x(24, 24)), {})),
        ("concatenated, bias", lambda: ((x(5, 24), x(24, 24), None, x(24)), {})),
        ("concatenated, bias step-sliced", lambda: ((x(5, 24), x(24, 24), None, x(48)[::2]), {})),
    ]


def _check_call(args, kwargs):
    with Unchanged(*args):
        got = gated_linear(*args, **kwargs)
    full = gated_linear.canonical(args, kwargs)  # (x, weight, up_weight, bias, up_bias, activation)
    _assert_gated_close(got, *full, full[0].dtype)
    return got


@pytest.mark.parametrize("vendor", ["kernel", "vendor"], indirect=True)
def test_each_signature_builds_its_own_route_and_repeats_skip_the_check(backend, device, nan_memory, vendor,
                                                                        monkeypatch):
    """Every call that differs in shape, strides, dtype, activation, weight form or bias presence
    takes the full path once (its own check and route) and is compared with float64; a second
    round of the same signatures with fresh data skips the check every time."""
    checks = _Checks(monkeypatch)
    signatures = _signatures(device)
    for label, make in signatures:
        before = checks.n
        _check_call(*make())
        assert checks.n == before + 1, label  # a new signature: never another's route
    for label, make in signatures:
        args, kwargs = make()
        route = gated_linear.repeat_route(*args, **kwargs)
        if backend.runs_triton:
            kind = VendorRoute if vendor else KernelRoute
            assert type(route) is kind, (label, route)
        else:
            assert route is None
        _check_call(args, kwargs)
    assert checks.n == len(signatures) * (1 if backend.runs_triton else 2)


def test_misaligned_repeat_and_keyword_forms(backend, device, nan_memory, monkeypatch):
    """A repeat whose pointers are off 16-byte alignment (same shape and strides) computes right;
    the keyword forms of one call are hot too."""
    checks = _Checks(monkeypatch)
    buf = rand((6 * 24 + 3,), torch.float32, device)
    wg, wu = rand((12, 24), torch.float32, device), rand((12, 24), torch.float32, device)
    for off in (0, 1, 3, 0):
        x = buf[off:off + 5 * 24].view(5, 24)
        _check_call((x, wg, wu), {})
        _check_call((x, wg), {"up_weight": wu})
        _check_call((x, wg, wu), {"activation": "gelu_tanh"})
    assert checks.n == (3 if backend.runs_triton else 12)


@pytest.mark.parametrize("vendor", ["kernel", "vendor"], indirect=True)
@pytest.mark.parametrize("concat", [False, True], ids=["separate", "concatenated"])
def test_gradients_through_a_repeated_call(backend, device, vendor, concat, monkeypatch):
    """A call requiring a gradient after the signature has its route: the vendor route's
    ``autograd_run`` (PyTorch's composition, no check) or the op's autograd.Function (kernel
    route); gradients of every input against float64 either way."""
    d = torch.float32
    args = _args(device, d, m=4, k=12, n=6, lead=(2,), concat=concat)
    with torch.no_grad():
        gated_linear(*args, activation="gelu")  # leaves the route
        gated_linear(*args, activation="gelu")
    route = gated_linear.repeat_route(*args, activation="gelu")
    assert (route is not None) == backend.runs_triton
    if route is not None:
        assert route.records_autograd == vendor and (route.autograd_run is not None) == vendor
    checks = _Checks(monkeypatch)
    dy = rand((2, 4, 6), d, device)
    y, grads = _grads(lambda *a: gated_linear(*a, activation="gelu"), args, dy)
    assert checks.n == (0 if vendor and backend.runs_triton else 1)
    y64, ref = _grads(lambda *a: reference_gated_linear(*a, activation="gelu"),
                      [None if a is None else a.double().cpu() for a in args], dy.double().cpu())
    torch.testing.assert_close(y.cpu().double(), y64, rtol=1e-4, atol=1e-4)
    for name, g, r in zip(("x", "weight", "up_weight", "bias", "up_bias"), grads, ref):
        assert (g is None) == (r is None), name
        if g is not None:
            torch.testing.assert_close(g.cpu().double(), r, rtol=1e-4, atol=1e-5 * (r.abs().max().item() + 1),
                                       msg=name)
