"""``xkernels.nn.Linear`` and ``xkernels.nn.Conv1D``: drop-in modules over ``xkernels.ops.linear``."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close, require_transformers
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
