"""The host side of add/broadcast (``ops/elementwise/binary.py``): which kernel variant a layout
gets (flat, tiled, tiled with a row operand, operands materialised), how a config is clamped to
the call, the scalar modes, and the results of each variant against float64 PyTorch with
NaN-poisoned outputs. The plan decisions are read on the interpreter (its own tables); the
results run on every test backend."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close, poisoned, rand
from xkernels import tuning
from xkernels.ops import add, broadcast
from xkernels.ops.elementwise.binary import BinaryPlan


def _plan(op, *args, **kwargs) -> BinaryPlan:
    plan = op.plan(op.check(*args, **kwargs), xkernels.get_backend("interpreter"))
    assert isinstance(plan, BinaryPlan)
    return plan


def _t(*shape):
    return torch.randn(shape)


# -- which variant ------------------------------------------------------------------------------
@pytest.mark.uses_interpreter
def test_same_shape_contiguous_is_flat_even_when_it_collapses_from_many_dims():
    p = _plan(add, _t(2, 3, 5), _t(2, 3, 5))
    assert p.variant == "flat" and p.jit_fn.__name__ == "binary_flat_kernel" and not p.materialize
    assert (p.constexprs["X_MODE"], p.constexprs["Y_MODE"]) == (0, 0) and p.tail[0] == 30
    assert not p.constexprs["HAS_ALPHA"] and not p.constexprs["INDEX_64"]


@pytest.mark.uses_interpreter
def test_a_bias_row_is_tiled_and_loaded_once_per_tile():
    p = _plan(broadcast, _t(6, 40), _t(40))
    assert p.variant == "tiled (row operand loaded once per tile)" and p.jit_fn.__name__ == "binary_tiled_kernel"
    assert (p.constexprs["X_MODE"], p.constexprs["Y_MODE"]) == (0, 1)
    rows, n_cols = p.tail[0], p.tail[1]
    assert (rows, n_cols) == (6, 40)


@pytest.mark.uses_interpreter
def test_strided_operands_or_out_are_tiled_without_a_row_operand():
    x = _t(40, 6).t()  # transposed: strides (1, 6)
    p = _plan(add, x, _t(6, 40))
    assert p.variant == "tiled" and p.constexprs["Y_MODE"] == 0
    out = torch.empty(40, 6).t()
    p = _plan(add, _t(6, 40), _t(6, 40), out=out)  # contiguous inputs, transposed out
    assert p.variant == "tiled"


@pytest.mark.uses_interpreter
def test_python_numbers_pass_by_value_and_alpha_is_a_constexpr_switch():
    p = _plan(add, _t(3, 50), 2.5)
    assert p.variant == "flat" and (p.constexprs["X_MODE"], p.constexprs["Y_MODE"]) == (0, 2)
    p = _plan(add, 2.5, _t(3, 50))
    assert (p.constexprs["X_MODE"], p.constexprs["Y_MODE"]) == (2, 0)
    assert _plan(add, _t(7), _t(7), alpha=0.5).constexprs["HAS_ALPHA"]
    assert not _plan(add, _t(7), _t(7), alpha=1).constexprs["HAS_ALPHA"]
    # alpha's value is not in the plan: one plan for every alpha != 1, its value passed per call
    c1, c2 = add.check(_t(7), _t(7), alpha=0.5), add.check(_t(7), _t(7), alpha=3.0)
    backend = xkernels.get_backend("interpreter")
    assert add.plan_key(c1, backend) == add.plan_key(c2, backend)
    assert add.plan_key(c1, backend) != add.plan_key(add.check(_t(7), _t(7)), backend)


@pytest.mark.uses_interpreter
def test_more_than_four_non_collapsible_dims_are_materialised_flat():
    p = _plan(broadcast, _t(2, 3, 4, 5, 6), _t(3, 1, 5, 1))
    assert p.materialize and p.variant == "flat" and p.tail[0] == 2 * 3 * 4 * 5 * 6
    assert not _plan(broadcast, _t(2, 3, 4, 5), _t(3, 1, 5)).materialize  # four dims: tiled as they are


# -- how a config fits the call -----------------------------------------------------------------
@pytest.mark.uses_interpreter
def test_flat_block_is_clamped_to_the_size_and_sub_divides_it():
    with tuning.force({"BLOCK": 2048, "SUB": 48}):
        p = _plan(add, _t(100), _t(100))
    assert p.constexprs["BLOCK"] == 128  # next power of two of 100, not 2048
    assert p.constexprs["SUB"] == 16  # gcd(48, 128): SUB must divide BLOCK
    assert not p.constexprs["EVEN"] and p.tail[2] == 1  # one block, masked
    assert p.config["BLOCK"] == 128 and p.source == "forced by xkernels.tuning.force()"
    with tuning.force({"BLOCK": 64}):
        p = _plan(add, _t(256), _t(256))
    assert (p.constexprs["BLOCK"], p.constexprs["SUB"], p.tail[2]) == (64, 64, 4) and p.constexprs["EVEN"]
    assert p.tiles == 4 and p.programs <= 4 and p.constexprs["PERSISTENT"] == (p.programs < 4)


@pytest.mark.uses_interpreter
def test_tiled_block_n_is_clamped_and_its_share_moves_to_block_m():
    with tuning.force({"BLOCK_M": 2, "BLOCK_N": 256}):
        p = _plan(broadcast, _t(20, 40), _t(40))
    # BLOCK_N 256 > next_pow2(40) = 64: four times narrower, so up to four times taller
    assert (p.constexprs["BLOCK_N"], p.constexprs["BLOCK_M"]) == (64, 8)
    assert p.constexprs["SUB_M"] == 8 and not p.constexprs["EVEN"]
    assert p.tiles == 3  # ceil(20 / 8) row blocks x one column block
    with tuning.force({"BLOCK_M": 64, "BLOCK_N": 16}):
        p = _plan(broadcast, _t(5, 32), _t(32))
    assert (p.constexprs["BLOCK_N"], p.constexprs["BLOCK_M"]) == (16, 8)  # BLOCK_M: at most next_pow2(rows)
    assert p.tiles == 2


# -- results of each variant --------------------------------------------------------------------
LAYOUTS = {
    "flat": lambda d, dev: (rand((3, 50), d, dev), rand((3, 50), d, dev)),
    "tiled row operand": lambda d, dev: (rand((6, 40), d, dev), rand((40,), d, dev)),
    "tiled transposed x": lambda d, dev: (rand((40, 6), d, dev).t(), rand((6, 40), d, dev)),
    "tiled column operand": lambda d, dev: (rand((6, 40), d, dev), rand((6, 1), d, dev)),
    "materialised 5-D": lambda d, dev: (rand((2, 3, 2, 3, 2), d, dev), rand((3, 1, 3, 1), d, dev)),
    "scalar y": lambda d, dev: (rand((3, 50), d, dev), 3 if not d.is_floating_point else -1.5),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_variant_matches_torch(backend, device, layout, dtype):
    x, y = LAYOUTS[layout](dtype, device)
    alpha = 2 if not dtype.is_floating_point else 0.5
    ref = torch.add(x.double() if dtype.is_floating_point else x.long(),
                    y.double() if isinstance(y, torch.Tensor) and dtype.is_floating_point
                    else y.long() if isinstance(y, torch.Tensor) else y, alpha=alpha)
    out = poisoned(tuple(ref.shape), dtype, device)
    with Unchanged(x, y):
        got = add(x, y, alpha=alpha, out=out)
    assert got is out
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("layout", ["flat", "tiled row operand", "materialised 5-D"])
def test_a_strided_out_gets_every_element(backend, device, layout):
    x, y = LAYOUTS[layout](torch.float32, device)
    shape = torch.broadcast_shapes(x.shape, y.shape)
    base = poisoned((*shape[:-1], 2 * shape[-1]), torch.float32, device)
    out = base[..., ::2]
    broadcast(x, y, out=out)
    assert_close(out, x.double() + y.double())
    assert torch.isnan(base[..., 1::2]).all()  # the gaps are not written
