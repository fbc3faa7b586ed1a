"""ops/matmul/vendor.py: linear's reference composition, the BLAS epilogue route and its zero bias."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xkernels.ops.matmul import vendor


@pytest.mark.parametrize("activation,want", [
    (None, lambda y: y), ("relu", F.relu), ("gelu", F.gelu), ("gelu_tanh", lambda y: F.gelu(y, approximate="tanh")),
    ("silu", F.silu), ("leaky_relu", lambda y: F.leaky_relu(y, 0.2))])
def test_reference_linear_is_the_unfused_composition(activation, want):
    d = torch.float64
    x, w, b = torch.randn(5, 8, dtype=d), torch.randn(6, 8, dtype=d), torch.randn(6, dtype=d)
    got = vendor.reference_linear(x, w, b, activation, 0.2)
    torch.testing.assert_close(got, want(x @ w.T + b))


@pytest.mark.parametrize("activation", list(vendor.BLAS_EPILOGUES))
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
def test_epilogue_linear_matches_the_reference(device, activation, with_bias):
    """On the device the op suites run on. aten's CPU ``_addmm_activation`` applies the exact
    (erf) GELU where cuBLASLt's epilogue is the tanh approximation: only cuda lists
    ``vendor_epilogues``, so the CPU is checked with relu alone."""
    if activation == "gelu_tanh" and device.type == "cpu":
        pytest.skip("aten's CPU _addmm_activation(use_gelu=True) is the erf GELU; no CPU backend uses it")
    x, w = torch.randn(5, 8, device=device), torch.randn(6, 8, device=device)
    b = torch.randn(6, device=device) if with_bias else None
    got = vendor.epilogue_linear(x, w.t(), b, activation)
    torch.testing.assert_close(got, vendor.reference_linear(x, w, b, activation), rtol=1e-4, atol=1e-4)


def test_zero_bias_is_kept_per_width_dtype_device_and_bounded(monkeypatch):
    monkeypatch.setattr(vendor, "_ZEROS", {})
    z = vendor.zero_bias(7, torch.float16, torch.device("cpu"))
    assert z.shape == (7,) and z.dtype == torch.float16 and not z.any()
    assert vendor.zero_bias(7, torch.float16, torch.device("cpu")) is z
    assert vendor.zero_bias(7, torch.float32, torch.device("cpu")) is not z
    for n in range(vendor._ZEROS_LIMIT + 3):
        vendor.zero_bias(100 + n, torch.float32, torch.device("cpu"))
    assert len(vendor._ZEROS) <= vendor._ZEROS_LIMIT
