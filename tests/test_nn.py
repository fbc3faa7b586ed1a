"""``xkernels.nn.Linear`` and ``xkernels.nn.Conv1D``: drop-in modules over ``xkernels.ops.linear``."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close, require_transformers
from xkernels.ops.matmul import linear as linear_op
from xkernels.ops.matmul.vendor import reference_linear


def _ref(x, weight, bias, activation, slope=0.01):
    return reference_linear(x.double(), weight.double(), None if bias is None else bias.double(), activation, slope)


@pytest.mark.parametrize("activation", [None, *xkernels.nn.linear_activations()])
def test_linear_matches_reference(backend, device, activation):
    layer = xkernels.nn.Linear(24, 40, activation=activation, negative_slope=0.2, device=device)
    x = torch.randn(3, 5, 24, device=device)
    with Unchanged(x, layer.weight, layer.bias):
        y = layer(x)
    slope = 0.2 if activation == "leaky_relu" else 0.01
    assert_close(y, _ref(x, layer.weight, layer.bias, activation, slope), scale=10)  # K=24 inner products


def test_linear_is_a_drop_in_nn_linear(device):
    torch_layer = torch.nn.Linear(8, 6, bias=False, device=device)
    layer = xkernels.nn.Linear(8, 6, bias=False, device=device, activation="relu")
    assert isinstance(layer, torch.nn.Linear)
    assert list(layer.state_dict()) == list(torch_layer.state_dict()) == ["weight"]
    layer.load_state_dict(torch_layer.state_dict())
    assert torch.equal(layer.weight, torch_layer.weight)
    assert layer.to(torch.float64).weight.dtype == torch.float64
    assert repr(layer) == "Linear(in_features=8, out_features=6, bias=False, activation='relu')"


def test_from_linear_shares_parameters(device):
    torch_layer = torch.nn.Linear(8, 6, device=device).eval()
    layer = xkernels.nn.Linear.from_linear(torch_layer, "silu")
    assert layer.weight is torch_layer.weight and layer.bias is torch_layer.bias
    assert not layer.training and layer.activation == "silu"
    with pytest.raises(TypeError, match="must be a torch.nn.Linear"):
        xkernels.nn.Linear.from_linear(torch.nn.ReLU())


def test_bad_activation_is_a_value_error():
    with pytest.raises(ValueError, match=r"xkernels.nn.Linear: 'activation' must be one of \[.*'relu'.*\] or None, "
                                         r"got 'tanh'"):
        xkernels.nn.Linear(4, 4, activation="tanh")
    with pytest.raises(TypeError, match="'negative_slope' must be a number"):
        xkernels.nn.Linear(4, 4, activation="leaky_relu", negative_slope="0.1")


def test_conv1d_matches_transformers_conv1d(backend, device):
    pytorch_utils = require_transformers("pytorch_utils")
    hf = pytorch_utils.Conv1D(12, 20).to(device)
    torch.nn.init.normal_(hf.bias)
    layer = xkernels.nn.Conv1D.from_conv1d(hf, "gelu")
    assert layer.weight is hf.weight and layer.bias is hf.bias
    assert list(layer.state_dict()) == list(hf.state_dict())
    fresh = xkernels.nn.Conv1D(12, 20, device=device)
    assert {k: v.shape for k, v in fresh.state_dict().items()} == {k: v.shape for k, v in hf.state_dict().items()}
    x = torch.randn(2, 3, 20, device=device)
    with Unchanged(x, hf.weight, hf.bias):
        y = layer(x)
    assert_close(y, _ref(x, hf.weight.t(), hf.bias, "gelu"), scale=10)
    assert_close(xkernels.nn.Conv1D.from_conv1d(hf)(x), _ref(x, hf.weight.t(), hf.bias, None), scale=10)


def test_one_module_reused_never_runs_a_stale_route(backend, device, monkeypatch):
    """A module's repeats run the route its own cache keeps (no check, on a kernel backend); every
    change of what the route depends on (input shape, strides, dtype, device, backend override,
    a converted or replaced parameter, the activation) is another key; gradients and train/eval
    stay right. Each call is compared with the float64 reference of the module's state then."""
    from xkernels.ops import linear

    checks = []
    real_check = linear.check
    monkeypatch.setattr(linear, "check", lambda *a, **k: checks.append(1) or real_check(*a, **k))
    layer = xkernels.nn.Linear(24, 16, activation="gelu", device=device)

    def run(x, dtype=torch.float32, grad=False):
        before = len(checks)
        if grad:
            x = x.detach().requires_grad_()
            y = layer(x)
            assert y.grad_fn is not None
            y.float().square().sum().backward()
            refs = [t.detach().double().requires_grad_() for t in (x, layer.weight)]
            _ref(refs[0], refs[1], layer.bias, layer.activation).square().sum().backward()
            assert_close(x.grad, refs[0].grad, dtype, scale=40)
            assert_close(layer.weight.grad, refs[1].grad, dtype, scale=40)
            layer.zero_grad()
        else:
            with torch.no_grad(), Unchanged(x):
                y = layer(x)
        assert_close(y, _ref(x, layer.weight, layer.bias, layer.activation, layer.negative_slope), dtype, scale=10)
        return len(checks) - before

    hot = backend.runs_triton
    first = 1 if hot else 0  # a backend that runs no kernels (cpu): F.linear itself, no check
    fresh = lambda *s, dtype=torch.float32: torch.randn(*s, device=device, dtype=dtype)  # noqa: E731
    assert run(fresh(3, 24)) == first
    assert run(fresh(3, 24)) == 0  # a repeat: the module's route, no check
    assert run(fresh(2, 5, 24)) == first  # another shape
    assert run(fresh(24, 7).t()) == first  # transposed input
    assert run(fresh(6, 48)[:, ::2]) == first  # sliced (strided) input
    assert run(fresh(6, 48)[:, ::2]) == 0
    assert run(fresh(6, 24)) == first  # the same shape, contiguous
    if backend.name != "cpu" and device.type == "cpu":
        torch_impl, seen = linear.torch_impl, []
        monkeypatch.setattr(linear, "torch_impl", lambda call: seen.append(1) or torch_impl(call))
        with xkernels.use_backend("cpu"):  # same signature, a backend that runs no kernels: F.linear itself
            assert run(fresh(3, 24)) == 0 and run(fresh(3, 24)) == 0 and not seen
        assert run(fresh(3, 24)) == 0 and not seen  # and back: the route
    layer.to(torch.bfloat16)
    assert run(fresh(3, 24, dtype=torch.bfloat16), torch.bfloat16) == first
    layer.to(torch.float32)
    layer.weight = torch.nn.Parameter(fresh(24, 16).t())  # replaced, other strides
    assert run(fresh(3, 24)) == first
    layer.weight = torch.nn.Parameter(fresh(16, 24))  # replaced, the first layout again: new values read
    assert run(fresh(3, 24)) == 0
    layer.bias = None
    assert run(fresh(3, 24)) == first
    layer.activation = "relu"
    assert run(fresh(3, 24)) == first
    layer.eval()
    assert run(fresh(3, 24)) == 0
    layer.train()
    run(fresh(3, 24), grad=True)  # a gradient required: the op's autograd, never the cached route
    assert run(fresh(3, 24)) == 0
    if device.type != "cpu":
        layer.to("cpu")
        with xkernels.use_backend("cpu"):
            x = torch.randn(3, 24)
            with torch.no_grad():
                assert_close(layer(x), _ref(x, layer.weight, None, "relu"), torch.float32, scale=10)


@pytest.mark.parametrize("pays,captured", [(False, False), (True, False), (False, True)],
                         ids=["does not pay", "pays", "does not pay, graph captured"])
def test_linear_trains_through_pytorch_where_kernels_cannot_repay_the_host_cost(backend, device, monkeypatch, pays,
                                                                               captured):
    """In eager training a patched linear runs xkernels only where the GEMM time a kernel could
    save outweighs its host premium (``Backend.linear_training_host_ms``, measured on cuda); else
    ``F.linear`` and the activation (PyTorch's autograd). A backend that runs no kernels (cpu)
    never, captured or not: its path would be PyTorch's ops behind the front door. Inference
    keeps xkernels, and so does a CUDA-graph capture (``_capturing``, faked here: replays cost no host time). Outputs and
    gradients match torch's either way."""
    monkeypatch.setattr(type(backend), "linear_training_host_ms", 0.0 if pays else 1e9)
    monkeypatch.setattr(xkernels.nn, "_paying", {})
    linear_op._forget()  # the native table holds the policy's answers too (as _paying): a new policy here
    monkeypatch.setattr(xkernels.nn, "_capturing", lambda t: captured)
    pays = backend.runs_triton and (pays or captured)
    torch_layer = torch.nn.Linear(24, 40, device=device)
    layer = xkernels.nn.Linear.from_linear(torch_layer, "gelu")
    calls = []
    real = xkernels.nn.RouteCache.recorded
    monkeypatch.setattr(xkernels.nn.RouteCache, "recorded", lambda self, *a: calls.append(1) or real(self, *a))
    x = torch.randn(3, 5, 24, device=device, requires_grad=True)
    for _ in range(2):  # the first call and a repeat
        calls.clear()
        y = layer(x)
        assert bool(calls) == pays
        gx, gw, gb = torch.autograd.grad(y.square().sum(), (x, layer.weight, layer.bias))
        x64 = x.detach().double().requires_grad_()
        w64, b64 = (p.detach().double().requires_grad_() for p in (layer.weight, layer.bias))
        want = torch.nn.functional.gelu(torch.nn.functional.linear(x64, w64, b64))
        assert_close(y, want, scale=10)
        for got, ref in zip((gx, gw, gb), torch.autograd.grad(want.square().sum(), (x64, w64, b64))):
            assert_close(got, ref, scale=100)
    calls.clear()
    with torch.no_grad():
        layer(x)
    assert not calls  # inference: the route cache's run, not a training record


def test_training_pays_weighs_gemm_time_against_host_time():
    """``training_pays``: three GEMMs at the matmul peak (measured, else the datasheet's bf16
    figure), GEMM_SAVING of their time, against the premium; no premium: always; no peak: never;
    a backend that runs no kernels: never."""
    from xkernels.backend import Figure

    class Props:
        def __init__(self, peak=None, sheet=None):
            self.matmul_peak = None if peak is None else Figure(peak, "TFLOP/s", "measured", "")
            self.datasheet = {} if sheet is None else {"bf16_tflops": Figure(sheet, "TFLOP/s", "datasheet", "")}

    class Fake:
        name = "fake"
        runs_triton = True

        def __init__(self, premium, props):
            self.linear_training_host_ms, self._props = premium, props

        def properties(self, device):
            return self._props

    xkernels.nn._paying.clear()
    cpu, pays = torch.device("cpu"), xkernels.nn.training_pays
    assert not pays(Fake(0.045, Props(800)), cpu, 8192, 768, 768)  # BERT-base's attention: ~12 us per GEMM
    assert pays(Fake(0.045, Props(800)), cpu, 2048, 14336, 4096)  # a Llama-3-8B MLP GEMM: ~300 us
    assert pays(Fake(0.0, Props()), cpu, 1, 1, 1)
    edge = 0.045 / (xkernels.nn.TRAINING_GEMMS * xkernels.nn.GEMM_SAVING) * 800e9 / 2  # flops where it pays
    rows = int(edge / (1024 * 1024)) + 1
    xkernels.nn._paying.clear()
    assert pays(Fake(0.045, Props(800)), cpu, rows, 1024, 1024)
    assert not pays(Fake(0.045, Props(800)), cpu, rows - 2, 1024, 1024)
    assert pays(Fake(0.045, Props(sheet=800)), cpu, rows + 1, 1024, 1024)  # the datasheet's figure
    assert not pays(Fake(0.045, Props()), cpu, 100 * rows, 1024, 1024)  # no peak known
    no_kernels = Fake(0.0, Props(800))
    no_kernels.runs_triton = False
    assert not pays(no_kernels, cpu, 2048, 14336, 4096)
