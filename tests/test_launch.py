"""Kernel launches (``xkernels/launch.py``): a :class:`Launcher` runs a real kernel (defined here)
in the interpreter with its plan's grid and constexprs; its ``hot`` launch functions take new
tensors and keep every other argument; a fast path that cannot be set up falls back for good;
constexprs that are not the trailing parameters are refused; ``ByValue`` keys launch functions by
value, zeros by their sign. (The direct C launch and Triton's compiled launcher need a GPU:
tests/backends/test_cuda_launch.py.)"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import xkernels
from helpers import Unchanged, assert_close, poisoned, rand
from xkernels import launch
from xkernels.launch import ByValue, Launcher

pytestmark = pytest.mark.uses_interpreter


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
    """out = x + alpha * y (SQUARE: x * x + alpha * y) over ``n`` elements."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if SQUARE:
        x = x * x
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + alpha * y, mask=mask)


@triton.jit
def constexpr_first_kernel(x_ptr, BLOCK: tl.constexpr, out_ptr, n):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def _launcher(n: int, block: int = 32, square: bool = False, fast: bool = False) -> Launcher:
    kernel = xkernels.get_backend("interpreter").kernel(scaled_add_kernel)
    return Launcher(kernel, (triton.cdiv(n, block),), {"BLOCK": block, "SQUARE": square}, {}, fast)


def _operands(n: int):
    return rand((n,), torch.float32, "cpu"), rand((n,), torch.float32, "cpu"), poisoned((n,), torch.float32, "cpu")


@pytest.mark.parametrize("n, block, square", [(100, 32, False), (64, 16, True), (5, 32, False)])
def test_launcher_runs_the_kernel_with_its_grid_and_constexprs(n, block, square):
    run = _launcher(n, block, square)
    for alpha in (0.5, -3.0):  # fresh data through the same launcher
        x, y, out = _operands(n)
        with Unchanged(x, y):
            run(x, y, out, n, alpha)
        ref = (x.double() ** 2 if square else x.double()) + alpha * y.double()
        assert_close(out, ref)


def test_a_partial_grid_leaves_the_rest_unwritten():
    """The grid is the plan's: a grid one block short writes nothing past it."""
    kernel = xkernels.get_backend("interpreter").kernel(scaled_add_kernel)
    x, y, out = _operands(100)
    Launcher(kernel, (3,), {"BLOCK": 32, "SQUARE": False}, {}, False)(x, y, out, 100, 1.0)
    assert_close(out[:96], x[:96].double() + y[:96].double())
    assert torch.isnan(out[96:]).all()


def test_hot_takes_new_tensors_and_keeps_the_other_arguments():
    n, alpha = 50, 2.0
    run = _launcher(n)
    x, y, out = _operands(n)
    leading = run.hot((x, y, out, n, alpha), 3)  # x, y, out vary; n and alpha are fixed
    placed = run.hot((x, y, out, n, alpha), (0, 2))  # x and out vary; y is the template's
    for _ in range(2):
        x2, y2, out2 = _operands(n)
        with Unchanged(x2, y2, y):
            assert leading(x2, y2, out2) is True
        assert_close(out2, x2.double() + alpha * y2.double())
        out3 = poisoned((n,), torch.float32, "cpu")
        assert placed(x2, out3) is True
        assert_close(out3, x2.double() + alpha * y.double())


def test_a_fast_path_that_cannot_be_set_up_falls_back_for_good(monkeypatch):
    """The interpreter returns no ``CompiledKernel``: a launcher asked for the fast path launches
    through ``kernel[grid]`` and keeps doing so, with right results every time."""
    monkeypatch.setattr(launch, "_FAST_OK", True)  # as on Triton 3.6, whatever this Triton is
    run = _launcher(40, fast=True)
    assert run.fast
    for _ in range(3):
        x, y, out = _operands(40)
        run(x, y, out, 40, 0.25)
        assert_close(out, x.double() + 0.25 * y.double())
        assert not run.fast
    assert run.hot_run((x, y, out, 40, 0.25)) is None  # no compiled launch to hand out


def test_constexprs_must_be_the_trailing_parameters():
    kernel = xkernels.get_backend("interpreter").kernel(constexpr_first_kernel)
    run = Launcher(kernel, (1,), {"BLOCK": 16}, {}, False)
    with pytest.raises(TypeError, match="constexprs are not the trailing kernel parameters"):
        run._setup(None, 3)  # (x_ptr, out_ptr, n) given, BLOCK sits between them
    good = Launcher(xkernels.get_backend("interpreter").kernel(scaled_add_kernel), (1,),
                    {"SQUARE": False, "BLOCK": 16}, {}, False)
    with pytest.raises(Exception) as err:  # past the order check: needs a compiled kernel and a driver
        good._setup(None, 5)
    assert "trailing" not in str(err.value)


def test_spec_covers_alignment_and_int_classes():
    base = torch.zeros(16, dtype=torch.float32)
    assert launch._spec(base) is True and launch._spec(base[1:]) is False  # 4 bytes off 16
    assert launch._spec(1) == (True, False, True)
    assert launch._spec(48) == (False, True, True)
    assert launch._spec(7) == (False, False, True)
    assert launch._spec(2**31) == (False, True, False) and launch._spec(-(2**31)) == (False, True, True)
    assert launch._spec(True) == "b" and launch._spec(0.5) is None


def test_by_value_makes_one_function_per_value_and_tells_zeros_apart():
    made = []

    def make(*values):
        made.append(values)
        return lambda: values

    by = ByValue(make)
    assert by(2.0, 1)() == (2.0, 1) and by(2.0, 1)() == (2.0, 1)
    assert made == [(2.0, 1)]
    plus, minus = by(0.0, 1), by(-0.0, 1)
    assert plus is not minus and len(made) == 3
    assert str(minus()[0]) == "-0.0" and str(plus()[0]) == "0.0"
    assert by(-0.0, 1) is minus and len(made) == 3
    for v in range(ByValue.LIMIT):
        by(float(v + 10), 1)
    assert len(by.fns) <= ByValue.LIMIT  # full: cleared before the next one is made
    assert by(2.0, 1)() == (2.0, 1)
