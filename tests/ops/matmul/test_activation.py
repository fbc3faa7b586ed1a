"""The epilogue activations of ``ops/matmul/kernels.py`` (``_activation``) element by element, in
Triton's interpreter: the fast erf GELU (``ACT`` 6, Abramowitz & Stegun 7.1.26) against a float64
reference and against libdevice's form (``ACT`` 2), and which plans use it (``plan.gelu_code``)."""

from __future__ import annotations

import pytest
import torch

import xkernels
from xkernels.backends.interpreter import _interpreted_module
from xkernels.ops.matmul import kernels as K
from xkernels.ops.matmul.plan import ACTIVATIONS, GELU_FAST_ERF, GELU_FAST_ERF_PTX, gelu_code

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.uses_interpreter

# the kernels module's interpreted copy (its helpers, _rcp / _exp2, interpreted with it)
_activation = _interpreted_module(K.__name__)._activation


@triton.jit
def activation_kernel(x_ptr, y_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, _activation(x, 0.0, ACT), mask=mask)


def _run(x: torch.Tensor, act: int) -> torch.Tensor:
    kernel = xkernels.get_backend("interpreter").kernel(activation_kernel)
    y = torch.full_like(x, float("nan"))
    kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), ACT=act, BLOCK=1024)
    return y


def _gelu64(x: torch.Tensor) -> torch.Tensor:
    """GELU in float64 through erfc (no cancellation for negative x)."""
    x = x.double()
    return x * 0.5 * torch.erfc(-x / 2**0.5)


def test_fast_erf_gelu_is_within_its_bound_in_fp32():
    """Absolute error <= 2.5e-7 max(1, |x|) in fp32 (the formula's erf error is <= 1.5e-7; GELU
    scales it by |x| / 2, plus fp32 rounding), over the range a GEMM's pre-activation takes."""
    x = torch.cat([torch.linspace(-10, 10, 40001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0])])
    ref = _gelu64(x)
    fast, lib = _run(x, GELU_FAST_ERF), _run(x, ACTIVATIONS["gelu"])
    assert torch.isfinite(fast).all()
    bound = 2.5e-7 * x.double().abs().clamp_min(1.0)
    assert ((fast.double() - ref).abs() <= bound).all(), (fast.double() - ref).abs().max()
    assert ((lib.double() - ref).abs() <= bound).all()  # libdevice's form meets the same bound


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_fast_erf_gelu_is_below_half_precision_rounding(dtype):
    """Rounded to an fp16/bf16 C, the fast erf's GELU is the correctly rounded reference or one
    unit off it (where the reference lies within ~5e-7 of a rounding boundary); only in the far
    negative tail (|GELU| < 1e-8, x < -6), where the formula's relative error passes bf16's unit,
    more (libdevice's 0.5 x (1 + erf) form cancels there, and is off sooner: from x ~ -4.5)."""
    x = torch.linspace(-8, 8, 40001)
    ref64 = _gelu64(x)
    ref = ref64.to(dtype)
    fast = _run(x, GELU_FAST_ERF).to(dtype).double()
    up = torch.nextafter(ref, torch.tensor(float("inf"), dtype=dtype)).double() - ref.double()
    down = ref.double() - torch.nextafter(ref, torch.tensor(float("-inf"), dtype=dtype)).double()
    unit = torch.maximum(up, down)  # the larger spacing: a unit off across a binade boundary
    off = (fast - ref.double()).abs()
    assert ((off <= unit * 1.0001) | (off <= 1e-8)).all(), (x[off > unit * 1.0001], off.max())
    big = ref64.abs() > 1e-3
    assert (off[big] > 0).double().mean() < 0.01  # almost always the same rounding as the reference's


def test_fp32_results_keep_libdevice_erf():
    """The fast erf's relative error is ~4x libdevice's in fp32 (kernels.py's module doc): plans
    use it only for an fp16/bf16 C, in its PTX form where the backend's kernels may carry PTX."""
    for ptx, fast in ((False, GELU_FAST_ERF), (True, GELU_FAST_ERF_PTX)):
        assert gelu_code("gelu", torch.bfloat16, ptx) == gelu_code("gelu", torch.float16, ptx) == fast
        assert gelu_code("gelu", torch.float32, ptx) == ACTIVATIONS["gelu"]
        for act in ("relu", "silu", "leaky_relu", "gelu_tanh", None):
            assert gelu_code(act, torch.bfloat16, ptx) == ACTIVATIONS[act]
    assert not xkernels.get_backend("interpreter").inline_ptx() and not xkernels.get_backend("cpu").inline_ptx()
