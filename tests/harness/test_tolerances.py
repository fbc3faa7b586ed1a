"""The tolerance table: every entry has a source; lookups cover every op, dtype and backend."""

from __future__ import annotations

import math

import pytest
import torch

import xkernels
from xkernels.backend import Backend
from xkernels.harness import tolerances as T
from xkernels.harness.cases import OP_NAMES, dtypes_for

CITATION = ("https://", "Higham", "IEEE 754", "integers are exact")


def test_every_entry_has_a_source():
    entries = [*T.ELEMENTWISE.values(), *T.MATMUL.values(), *T.NORM.values(), *T.ROTARY.values()]
    assert entries
    for tol in entries:
        assert any(c in tol.source for c in CITATION), tol
    for table in (T.ACTIVATION_SLOPE, T.UNIT_ROUNDOFF):
        for key, (value, source) in table.items():
            assert value > 0 and source.strip(), key


def test_torch_testing_defaults():
    """The float rows are torch.testing.assert_close's documented defaults."""
    assert (T.ELEMENTWISE[torch.float16].rtol, T.ELEMENTWISE[torch.float16].atol) == (1e-3, 1e-5)
    assert (T.ELEMENTWISE[torch.bfloat16].rtol, T.ELEMENTWISE[torch.bfloat16].atol) == (1.6e-2, 1e-5)
    assert (T.ELEMENTWISE[torch.float32].rtol, T.ELEMENTWISE[torch.float32].atol) == (1.3e-6, 1e-5)
    assert T.ELEMENTWISE[torch.int32].rtol == T.ELEMENTWISE[torch.int64].atol == 0


@pytest.mark.parametrize("backend_name", xkernels.list_backends())
def test_lookup_covers_every_op_and_dtype(backend_name):
    b = xkernels.get_backend(backend_name)
    for op in OP_NAMES:
        for dtype in dtypes_for(op):
            tol = T.tolerance(op, dtype, b)
            assert tol.source and tol.rtol >= 0 and tol.atol >= 0


class Tf32Backend(Backend):
    name = "tf32-test"
    device_type = "cpu"
    runs_triton = True

    def fp32_matmul_precision(self) -> str:
        return "tf32"


def test_tf32_loosens_float32_matmul_only():
    ieee = T.tolerance("matmul", torch.float32, xkernels.get_backend("interpreter"))
    tf32 = T.tolerance("matmul", torch.float32, Tf32Backend())
    assert tf32.operand_u == 2**-11 and "TF32" in tf32.source
    assert tf32.dot_coefficient(1024) > 100 * ieee.dot_coefficient(1024)
    assert T.tolerance("matmul", torch.float16, Tf32Backend()) == T.MATMUL[(torch.float16, "ieee")]


def test_dot_coefficient():
    tol = T.MATMUL[(torch.float16, "ieee")]
    assert tol.dot_coefficient(0) == 0
    assert tol.dot_coefficient(4) == pytest.approx(4 * 2**-24)  # worst case K*u for short sums
    assert tol.dot_coefficient(4096) == pytest.approx(4 * math.sqrt(4096) * 2**-24)
    assert tol.dot_coefficient(4096, "gelu") == pytest.approx(1.13 * tol.dot_coefficient(4096))
    assert T.ELEMENTWISE[torch.float16].dot_coefficient(4096) == 0


def test_unfused_linear_allows_rounded_pre_activation():
    cpu, interp = xkernels.get_backend("cpu"), xkernels.get_backend("interpreter")
    fused = T.tolerance("linear", torch.bfloat16, interp)
    unfused = T.tolerance("linear", torch.bfloat16, cpu)
    assert unfused.dot_coefficient(64, "gelu") - fused.dot_coefficient(64, "gelu") == pytest.approx(1.13 * 2**-8)
    assert unfused.dot_coefficient(64) == fused.dot_coefficient(64)  # no activation, no extra rounding
    assert "unfused" in unfused.source


def test_rotary_rounds_once_in_the_kernel_and_per_product_in_torch():
    """rotary_embedding: the dtype's element-wise tolerance (one rounding at the store) plus the fp32
    products and sum, 2 u_fp32 of |x_i cos_i| + |x_j sin_i|; on a backend that runs PyTorch's
    formula in a half dtype, each product is rounded to it as well (u (1 + u) more)."""
    cpu, interp = xkernels.get_backend("cpu"), xkernels.get_backend("interpreter")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        kernel = T.tolerance("rotary_embedding", dtype, interp)
        assert (kernel.rtol, kernel.atol) == (T.ELEMENTWISE[dtype].rtol, T.ELEMENTWISE[dtype].atol)
        assert kernel.dot_coefficient(2) == pytest.approx(2 * 2**-24) and "K = 2" in kernel.source
        torch_route = T.tolerance("rotary_embedding", dtype, cpu)
        u = T.UNIT_ROUNDOFF[dtype][0] if dtype != torch.float32 else 0.0
        assert torch_route.dot_coefficient(2) - kernel.dot_coefficient(2) == pytest.approx(u * (1 + u))
        assert ("runs PyTorch" in torch_route.source) == (dtype != torch.float32)
    assert "|x||cs|" in kernel.describe(2, magnitude="|x||cs|")


def test_relu2s_slope_is_carried_by_its_magnitude():
    """relu(h)^2 moves an error e in h by 2 relu(h) e, unbounded in h: its magnitude is 2 m^2 for
    the inner product's m = |x| @ |W|.T + |b| (>= |h|), so a result far from zero gets the room its
    slope gives it, and the description says so."""
    from xkernels.harness.accuracy import reference
    from xkernels.harness.case import Inputs

    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8) * 3, torch.randn(5, 8), torch.randn(5)
    _, plain, k = reference("linear", Inputs((x, w, b, "relu"), {}), torch.float32)
    ref, mag, _ = reference("linear", Inputs((x, w, b, "relu2"), {}), torch.float32)
    assert k == 8 and torch.equal(mag, 2 * plain * plain)
    h = torch.nn.functional.linear(x.double(), w.double(), b.double())
    assert torch.allclose(ref, torch.relu(h) ** 2) and bool((2 * h.abs() * plain <= mag * (1 + 1e-12)).all())
    tol = T.MATMUL[(torch.float32, "ieee")]
    assert tol.dot_coefficient(8, "relu2") == tol.dot_coefficient(8, "relu")
    assert "*2(|A||B|)^2" in tol.describe(8, "relu2")
