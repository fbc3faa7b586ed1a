"""Routes of matmul/linear repeats (``ops/matmul/hot.py``): which route a plan gets (a kernel
route, the aten call for a vendor plan, none where the call copies or writes ``out=``); a route
run on fresh operands gives exactly what the plan's full launch gives; and through the front
door, a repeat's entry is not reused for another shape, dtype or stride."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close, dot_scale, poisoned, rand
from xkernels import tuning
from xkernels.ops import linear, matmul
from xkernels.ops.matmul import hot
from xkernels.ops.matmul.vendor import reference_linear
from xkernels.ops.route import AtenRoute, KernelRoute

SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}


@pytest.fixture(autouse=True)
def _cold():
    for op in (matmul, linear):
        op._forget()


def _route(op, *args, config=SMALL, **kwargs):
    call = op.check(*args, **kwargs)
    with tuning.force(config):
        plan = op.plan(call, xkernels.get_backend("interpreter"))
    return plan, call, hot.make_hot(plan, call, op.canonical(args, kwargs))


def _full(plan, call, a, b, bias=None, slope=0.01):
    c = poisoned(tuple(call.out_shape), call.result_dtype, call.device)
    plan.launch(a, b, c, bias, slope, tuple(call.batch))
    return c


@pytest.mark.uses_interpreter
def test_a_kernel_route_gives_the_full_paths_result_on_fresh_operands():
    a, b = rand((33, 17), torch.float32, "cpu"), rand((17, 29), torch.float32, "cpu")
    plan, call, route = _route(matmul, a, b)
    assert isinstance(route, KernelRoute) and route.detail == f"{plan.variant} {plan.config}"
    for _ in range(2):
        a2, b2 = rand((33, 17), torch.float32, "cpu"), rand((17, 29), torch.float32, "cpu")
        with Unchanged(a2, b2):
            got = route.run(a2, b2, None)
        assert got.shape == (33, 29) and got.is_contiguous()
        assert torch.equal(got, _full(plan, call, a2, b2))  # the same kernel and config: the same bits
        assert_close(got, a2.double() @ b2.double(), scale=dot_scale(17))


@pytest.mark.uses_interpreter
def test_a_linear_route_takes_the_bias_and_leaky_relus_slope_per_call():
    x, w, bias = (rand(s, torch.float32, "cpu") for s in ((5, 32), (24, 32), (24,)))
    plan, call, route = _route(linear, x, w, bias, "leaky_relu", negative_slope=0.2)
    assert isinstance(route, KernelRoute)
    x2, w2, b2 = (rand(s, torch.float32, "cpu") for s in ((5, 32), (24, 32), (24,)))
    for slope in (0.2, 0.05):
        got = route.run(x2, w2, b2, "leaky_relu", slope, None, None)
        assert torch.equal(got, _full(plan, call, x2, w2.t(), b2, slope))
        assert_close(got, reference_linear(x2.double(), w2.double(), b2.double(), "leaky_relu", slope), scale=dot_scale(32))


@pytest.mark.uses_interpreter
def test_no_kernel_route_where_the_call_writes_out_or_copies_its_operands():
    a, b = rand((16, 16), torch.float32, "cpu"), rand((16, 16), torch.float32, "cpu")
    assert _route(matmul, a, b, out=torch.empty(16, 16))[2] is None
    a5, b4 = rand((2, 2, 2, 8, 9), torch.float32, "cpu"), rand((2, 1, 9, 5), torch.float32, "cpu")
    plan, _, route = _route(matmul, a5, b4)
    assert plan.materialize and route is None


@pytest.mark.uses_interpreter
def test_a_vendor_plan_routes_to_the_aten_call():
    a, b = rand((8, 16), torch.float32, "cpu"), rand((16, 8), torch.float32, "cpu")
    plan, _, route = _route(matmul, a, b, config={"VENDOR": True})
    assert plan.vendor and isinstance(route, AtenRoute) and route.detail == "torch.matmul"
    a2, b2 = rand((8, 16), torch.float32, "cpu"), rand((16, 8), torch.float32, "cpu")
    assert torch.equal(route.run(a2, b2, None), torch.matmul(a2, b2))
    x, w = rand((4, 16), torch.float32, "cpu"), rand((8, 16), torch.float32, "cpu")
    _, _, route = _route(linear, x, w, config={"VENDOR": True})
    assert isinstance(route, AtenRoute) and route.detail == "F.linear"
    assert torch.equal(route.run(x, w, None, None, 0.01, None, None), torch.nn.functional.linear(x, w))


class _Checks:
    def __init__(self, op, monkeypatch):
        self.n, real = 0, op.check

        def counted(*args, **kwargs):
            self.n += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(op, "check", counted)


def test_a_repeat_entry_is_not_reused_for_another_shape_dtype_or_stride(backend, device, monkeypatch):
    """Each new signature takes the full path (its check runs) and gets its own right result;
    its own repeat is then hot where the backend runs kernels."""
    checks = _Checks(matmul, monkeypatch)
    hot_here = backend.runs_triton

    def call(a, b, dtype):
        with Unchanged(a, b):
            got = matmul(a, b)
        assert_close(got, a.double() @ b.double(), dtype, scale=dot_scale(a.shape[-1]))
        return got

    base = (rand((12, 20), torch.float32, device), rand((20, 10), torch.float32, device))
    call(*base, torch.float32)
    call(rand((12, 20), torch.float32, device), rand((20, 10), torch.float32, device), torch.float32)
    assert checks.n == (1 if hot_here else 2)
    others = [
        (rand((13, 20), torch.float32, device), rand((20, 10), torch.float32, device), torch.float32),  # shape
        (rand((12, 20), torch.bfloat16, device), rand((20, 10), torch.bfloat16, device), torch.bfloat16),  # dtype
        (rand((20, 12), torch.float32, device).t(), rand((20, 10), torch.float32, device), torch.float32),  # stride
        (rand((12, 40), torch.float32, device)[:, ::2], rand((20, 10), torch.float32, device), torch.float32),
    ]
    for i, (a, b, dtype) in enumerate(others):
        before = checks.n
        call(a, b, dtype)
        assert checks.n == before + 1, f"signature {i} reused another signature's entry"
        call(*(t.clone() if t.is_contiguous() else t for t in (a, b)), dtype)  # its own repeat
        assert checks.n == before + (1 if hot_here else 2)
