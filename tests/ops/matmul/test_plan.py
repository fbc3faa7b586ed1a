"""How a matmul/linear call launches (``ops/matmul/plan.py``): for small shapes on the interpreter
with a forced config, the blocks as clamped to the problem, tiles and grid, the epilogue
constexprs, batch handling (collapsed, materialised), divisibility hints, the vendor plan, what
``explain`` reports of the plan; and the plan's own launch against float64 PyTorch into a
NaN-poisoned result. (Which config is chosen and why: test_config.py.)"""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close, dot_scale, poisoned, rand
from xkernels import tuning
from xkernels.ops import linear, matmul
from xkernels.ops.matmul.plan import ACTIVATIONS, MatmulPlan
from xkernels.ops.matmul.vendor import reference_linear

pytestmark = pytest.mark.uses_interpreter

SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}


@pytest.fixture(autouse=True)
def _cold():
    """No hot entries or cached plans from other tests: ``explain`` describes a plan."""
    for op in (matmul, linear):
        op._forget()
        op._plans.clear()


def _plan(op, *args, config=SMALL, **kwargs):
    call = op.check(*args, **kwargs)
    with tuning.force(config):
        plan = op.plan(call, xkernels.get_backend("interpreter"))
    assert isinstance(plan, MatmulPlan)
    return plan, call


def _run(plan: MatmulPlan, call) -> torch.Tensor:
    """The plan's own launch into a NaN-poisoned result."""
    c = poisoned((*call.batch, call.a.shape[-2], call.b.shape[-1]), call.result_dtype, call.device)
    plan.launch(call.a, call.b, c, call.bias, call.slope, tuple(call.batch), call.residual)
    return c.view(call.out_shape)


def test_blocks_tiles_and_grid_of_a_small_matmul():
    a, b = rand((33, 17), torch.float32, "cpu"), rand((17, 29), torch.float32, "cpu")
    plan, call = _plan(matmul, a, b, config={**SMALL, "BLOCK_M": 128})
    c = plan.constexprs
    assert (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]) == (64, 16, 16)  # 128 clamped to next_pow2(33)
    assert plan.variant == "matmul" and not plan.vendor and plan.tma is None and plan.split_k == 1
    M, N, K, batch, tiles_m, tiles_n, tiles, programs = plan.dims
    assert (M, N, K, batch, tiles_m, tiles_n, tiles) == (33, 29, 17, 1, 1, 2, 2)
    assert plan.grid == (programs,) and programs <= tiles and c["PERSISTENT"] == (programs < tiles)
    assert not c["EVEN_K"] and not c["HAS_BIAS"] and c["ACT"] == 0 and not c["INDEX_64"]
    assert plan.config["BLOCK_M"] == 64 and plan.source == "forced by xkernels.tuning.force()"
    with Unchanged(a, b):
        got = _run(plan, call)
    assert_close(got, a.double() @ b.double(), scale=dot_scale(17))


@pytest.mark.parametrize("activation", ["relu", "gelu", "leaky_relu"])
def test_linear_epilogue_constexprs_and_result(activation):
    x, w, bias = (rand(s, torch.float32, "cpu") for s in ((5, 32), (24, 32), (24,)))
    plan, call = _plan(linear, x, w, bias, activation, negative_slope=0.2)
    assert plan.variant == f"matmul + bias + {activation}"
    assert plan.constexprs["ACT"] == ACTIVATIONS[activation] and plan.constexprs["HAS_BIAS"]
    assert plan.constexprs["EVEN_K"]  # K = 32, BLOCK_K = 16
    got = _run(plan, call)
    assert_close(got, reference_linear(x.double(), w.double(), bias.double(), activation, 0.2), scale=dot_scale(32))


def test_a_bfloat16_dot_is_upcast_where_the_backend_has_no_native_one():
    a, b = rand((16, 16), torch.bfloat16, "cpu"), rand((16, 16), torch.bfloat16, "cpu")
    plan, call = _plan(matmul, a, b)
    assert plan.constexprs["UPCAST"] == (not xkernels.get_backend("interpreter").native_bf16_dot)
    assert plan.constexprs["PRECISION"] == "ieee"
    assert_close(_run(plan, call), a.double() @ b.double(), torch.bfloat16, scale=4)


def test_batches_run_as_they_are_or_are_materialised():
    a, b = rand((3, 16, 17), torch.float32, "cpu"), rand((3, 17, 8), torch.float32, "cpu")
    plan, call = _plan(matmul, a, b)
    assert not plan.materialize and plan.dims[3] == 3 and plan.dims[6] == 3  # 3 batches x 1 tile
    assert_close(_run(plan, call), a.double() @ b.double(), scale=dot_scale(a.shape[-1]))

    a, b = rand((2, 1, 16, 17), torch.float32, "cpu"), rand((3, 17, 8), torch.float32, "cpu")
    plan, call = _plan(matmul, a, b)  # broadcast batch dims: stride 0, no copies
    assert not plan.materialize and plan.strides[0] != 0 and plan.strides[1] == 0
    assert_close(_run(plan, call), a.double() @ b.double(), scale=dot_scale(a.shape[-1]))

    a, b = rand((2, 2, 2, 8, 9), torch.float32, "cpu"), rand((2, 1, 9, 5), torch.float32, "cpu")
    plan, call = _plan(matmul, a, b)  # three batch dims that do not collapse: copied contiguous
    assert plan.materialize and plan.dims[3] == 8
    assert_close(_run(plan, call), a.double() @ b.double(), scale=dot_scale(a.shape[-1]))


def test_divisibility_hints_follow_the_shape():
    """Powers of two Triton does not see (it specializes on multiples of 16 only), along
    contiguous dims and leading strides: K = 40 and N = 24 divide by 8."""
    a, b = rand((20, 40), torch.float32, "cpu"), rand((40, 24), torch.float32, "cpu")
    plan, call = _plan(matmul, a, b)
    assert plan.config["divisibility hints"] == {"DIV_N": 8, "DIV_K": 8, "DIV_SAM": 8, "DIV_SBK": 8, "DIV_SCM": 8}
    assert plan.constexprs["DIV_M"] == 1  # M = 20 runs along a's rows, not a contiguous dim
    # fp32 sums of 40 unit-normal products: rounding reaches a few 1e-6 where they cancel
    assert_close(_run(plan, call), a.double() @ b.double(), scale=40 / 8)
    odd, _ = _plan(matmul, rand((33, 17), torch.float32, "cpu"), rand((17, 29), torch.float32, "cpu"))
    assert "divisibility hints" not in odd.config
    sixteens, _ = _plan(matmul, rand((32, 64), torch.float32, "cpu"), rand((64, 48), torch.float32, "cpu"))
    assert "divisibility hints" not in sixteens.config  # multiples of 16: Triton already knows


def test_a_forced_vendor_config_plans_the_pytorch_call():
    a, b = rand((8, 16), torch.float32, "cpu"), rand((16, 8), torch.float32, "cpu")
    plan, call = _plan(matmul, a, b, config={"VENDOR": True})
    assert plan.vendor and plan.route == "vendor BLAS" and plan.config == {"VENDOR": True}
    assert plan.variant == "torch.matmul (the device's BLAS)" and plan.programs is None
    plan, _ = _plan(linear, a, b.t().contiguous(), None, "relu", config={"VENDOR": True})
    assert plan.variant == "F.linear + activation (the device's BLAS)"


def test_explain_reports_the_plan():
    a, b = rand((33, 17), torch.float32, "cpu"), rand((17, 29), torch.float32, "cpu")
    with xkernels.use_backend("interpreter"), tuning.force(SMALL):
        e = matmul.explain(a, b)
        plan = matmul.plan(matmul.check(a, b), xkernels.get_backend("interpreter"))
    assert e.backend == "interpreter" and e.route == plan.route == "triton kernel"
    assert e.variant == plan.variant and e.config == plan.config and e.config_source == plan.source
    assert (e.programs, e.tiles) == (plan.programs, plan.tiles)
    assert f"BLOCK_M={plan.config['BLOCK_M']}" in str(e) and "from: forced by xkernels.tuning.force()" in str(e)
    assert f"launch: {plan.programs} programs for {plan.tiles} tiles" in str(e)
