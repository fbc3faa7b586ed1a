"""``xkernels.enable()`` / ``disable()`` / ``enabled()``: aten ops of an unmodified model routed to
xkernels on the backend under test (cpu tensors are routed while a kernel backend such as
``interpreter`` is forced; the ``cpu`` backend runs no kernels, so nothing is routed there)."""

from __future__ import annotations

import copy

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_model_close
from xkernels import routing
from xkernels.backends import native
from xkernels.ops import matmul


@pytest.fixture(autouse=True)
def _routing_off():
    routing.disable()
    routing.routing_counts(reset=True)
    yield
    routing.disable()
    assert routing.enabled_ops() == {}


class Block(torch.nn.Module):
    """Linear with bias (addmm), batched products (bmm), a bias-free linear (mm), a residual add."""

    def __init__(self, d: int = 16, h: int = 24) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x.reshape(-1, x.shape[-1]))).reshape(*x.shape[:-1], -1)
        att = torch.softmax(torch.bmm(h, h.transpose(1, 2)) / h.shape[-1], dim=-1)
        h = torch.bmm(att, h)
        y = self.fc2(h.reshape(-1, h.shape[-1])).reshape(x.shape)
        y.add_(0.5 * x)
        return x + y


def _run(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    model.zero_grad()
    y = model(x)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype, device=y.device).reshape(y.shape)).sum().backward()
    return y.detach(), [p.grad.detach().clone() for p in model.parameters()], x.grad.detach()


def test_unmodified_model_output_and_gradients(backend, device):
    model = Block().to(device)
    model64 = copy.deepcopy(model).double()
    x = torch.randn(2, 5, 16, device=device)
    want = _run(model, x)
    ref64 = _run(model64, x.double())
    with Unchanged(x, *model.parameters()):
        with xkernels.enabled():
            got = _run(model, x)
    counts = xkernels.routing_counts()
    if backend.runs_triton:
        # forward: addmm, bmm x2, mm, add_, add; backward: mm / bmm for the input and weight grads
        for name, least in (("addmm", 1), ("bmm", 4), ("mm", 3), ("add.Tensor", 1), ("add_.Tensor", 1)):
            assert counts[name].get("xkernels", 0) >= least, (name, counts)
    else:
        assert counts == {}, "the cpu backend runs no kernels: nothing may be routed"
    for g, w, r in zip([got[0], *got[1], got[2]], [want[0], *want[1], want[2]], [ref64[0], *ref64[1], ref64[2]]):
        assert_model_close(g, w, r)
    assert got[0].requires_grad is False and all(p.grad is not None for p in model.parameters())


def test_enable_disable_restore_aten(backend, device):
    a, b = torch.randn(6, 5, device=device), torch.randn(5, 7, device=device)
    xkernels.enable(ops=["matmul"])
    xkernels.enable(ops=["matmul"])  # twice: one registration per op and key
    keys = routing.dispatch_keys()
    # aten::matmul's Autograd-key kernel is registered from C++ only, on the keys it serves
    native_keys = [k for k in keys if k in routing.NATIVE_KEYS] if native.ready() is not None else []
    want = ({name: keys for name in ("bmm", "mm")} if keys else {}) | ({"matmul": native_keys} if native_keys else {})
    assert xkernels.enabled_ops() == want
    assert ("CPU" in keys) == (backend.runs_triton and backend.device_type == "cpu")
    torch.testing.assert_close(a @ b, torch.ops.aten.mm.out(a, b, out=torch.empty(0, device=device)))
    xkernels.disable()
    xkernels.disable()  # disable without enable: nothing to undo
    assert xkernels.enabled_ops() == {}
    before = xkernels.routing_counts()
    a @ b
    a + a
    assert xkernels.routing_counts() == before, "aten's own kernels run after disable()"
    if backend.runs_triton:
        # a first call runs the op's full path; where its route is the BLAS (cuda's selection for
        # a launch-bound call without a measured margin), the op's own aten call comes back
        # through the override and goes to aten as a re-entrant call
        vendor = matmul.explain(a, b).route == "vendor BLAS"
        assert before["mm"] == ({"xkernels": 1, "aten: re-entrant call": 1} if vendor else {"xkernels": 1})


def test_nested_enabled_restores_outer_selection(backend):
    with xkernels.enabled(ops=["add"]):
        outer = xkernels.enabled_ops()
        with xkernels.enabled(ops=["mm"]):
            inner = set(xkernels.enabled_ops())
        assert xkernels.enabled_ops() == outer
    assert xkernels.enabled_ops() == {}
    if backend.runs_triton and backend.device_type == "cpu":
        assert set(outer) == {"add.Tensor", "add_.Tensor"} and inner == {"add.Tensor", "add_.Tensor", "mm"}


def test_unknown_op_names():
    with pytest.raises(ValueError, match=r"unknown op name\(s\) \['conv2d'\]; known: \["):
        xkernels.enable(ops=["add", "conv2d"])
    with pytest.raises(TypeError, match="must be a list of names"):
        xkernels.enable(ops="add")
    assert xkernels.enabled_ops() == {}


def test_fallback_dtypes_reach_aten_without_recursion(backend, device):
    a, b = torch.randn(4, 3, dtype=torch.float64, device=device), torch.randn(3, 5, dtype=torch.float64, device=device)
    i = torch.randint(-5, 5, (4, 3), dtype=torch.int16, device=device)
    with xkernels.enabled():
        mm, add, iadd = a @ b, a + a.t().t(), i + i
        bias = torch.randn(5, dtype=torch.float64, device=device)
        addmm = torch.addmm(bias, a, b)
    torch.testing.assert_close(mm, torch.ops.aten.mm.out(a, b, out=torch.empty(0, dtype=a.dtype, device=device)))
    torch.testing.assert_close(addmm, mm + bias)
    torch.testing.assert_close(add, 2 * a)
    assert torch.equal(iadd, 2 * i)
    counts = xkernels.routing_counts()
    if backend.runs_triton:
        assert counts["mm"] == {"aten: dtype torch.float64": 1}
        assert counts["addmm"] == {"aten: dtype torch.float64": 1}
        assert counts["add.Tensor"] == {"aten: dtype torch.float64": 1, "aten: dtype torch.int16": 1}


def test_reentrant_aten_call_inside_an_override_reaches_aten(backend, device, monkeypatch):
    """An xkernels op that itself calls a routed aten op (as a plugin implementation may) gets
    aten's kernel for it, not the override again."""
    from xkernels.ops.elementwise.add import add

    real = add.call_no_grad
    inner = []

    def calls_torch_add(x, y, **kw):
        inner.append(torch.add(x, y))  # re-enters aten::add.Tensor from inside the override
        return real(x, y, **kw)

    monkeypatch.setattr(add, "call_no_grad", calls_torch_add)
    x = torch.randn(3, 4, device=device)
    with xkernels.enabled(ops=["add"]):
        y = x + x
    torch.testing.assert_close(y, 2 * x)
    counts = xkernels.routing_counts()
    if backend.runs_triton:
        assert counts["add.Tensor"] == {"xkernels": 1, "aten: re-entrant call": 1}
        torch.testing.assert_close(inner[0], 2 * x)


def test_add_semantics_kept(backend, device):
    x = torch.randn(3, 4, device=device)
    t = x.t()  # non-contiguous: aten's result strides follow the input's
    y = torch.randn(4, device=device)
    with xkernels.enabled(ops=["add"]):
        tt = t + t
        scaled = x.add(y, alpha=2.5)
        half = torch.randn(3, 4, device=device).half() + 1.5
        inplace = x.clone().add_(y)
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            y.clone().add_(x)
    assert tt.stride() == (t + t).stride() and torch.equal(tt, t + t)
    torch.testing.assert_close(scaled, x + 2.5 * y)
    assert half.dtype == torch.float16
    torch.testing.assert_close(inplace, x + y)
    counts = xkernels.routing_counts()
    if backend.runs_triton:
        assert counts["add.Tensor"]["aten: non-contiguous operand"] == 1, counts
        assert counts["add.Tensor"]["xkernels"] == 2, counts
        assert counts["add_.Tensor"] == {"xkernels": 1, "aten: broadcast grows self": 1}


def test_calls_xkernels_routes_to_the_vendor_blas_go_to_aten_directly(backend, device, monkeypatch):
    """Where xkernels' route for a signature is the device's BLAS (the aten call itself), a repeated
    routed call runs aten's ``.out`` kernel at once (counted as such) instead of going through
    the op and back through the override; results and gradients stay torch's."""
    from helpers import every_matmul_to_vendor

    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs no kernels: nothing is routed")
    with every_matmul_to_vendor(monkeypatch):
        model = Block().to(device)
        x = torch.randn(2, 5, 16, device=device)
        want = _run(model, x)
        with xkernels.enabled(ops=["matmul", "linear"]):
            for _ in range(3):  # the first call of each signature plans it, the next ones repeat
                got = _run(model, x)
        a, b, bias = torch.randn(6, 5, device=device), torch.randn(5, 7, device=device), torch.randn(7, device=device)
        with xkernels.enabled(ops=["matmul", "linear"]):
            pairs = [(torch.addmm(bias, a, b), torch.ops.aten.addmm.out(bias, a, b, out=torch.empty(0, device=device)))
                     for _ in range(2)] + [(a @ b, torch.ops.aten.mm.out(a, b, out=torch.empty(0, device=device)))
                                          for _ in range(2)]
    for g, w in zip([got[0], *got[1], got[2]], [want[0], *want[1], want[2]]):
        torch.testing.assert_close(g, w)
    for g, w in pairs:
        assert g.shape == w.shape and g.is_contiguous()
        torch.testing.assert_close(g, w)
    counts = xkernels.routing_counts()
    for name in ("addmm", "mm", "bmm"):
        assert counts[name].get(routing.VENDOR_WHY, 0) >= 2, (name, counts)
        # each first call ran the op (whose torch call came back as a re-entrant one), no more
        assert counts[name].get("aten: re-entrant call", 0) == counts[name].get("xkernels", 0), (name, counts)


def test_a_repeated_routed_add_skips_the_checks_and_keeps_aten_semantics(backend, device, monkeypatch):
    """A routed add whose signature xkernels ran before goes straight to its hot entry (the checks
    are functions of the signature); fresh values give fresh results; a signature that went to
    aten (non-contiguous, alpha, a partially overlapping in-place add) never takes that way, even
    where the op itself has an entry for it."""
    from xkernels.ops import add

    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs no kernels: nothing is routed")
    x, y = torch.randn(6, 8, device=device), torch.randn(6, 8, device=device)
    t = torch.randn(8, 6, device=device).t()
    add(x, t)  # the op's own entry for (contiguous, transposed): aten's strides differ, routing refuses it
    with xkernels.enabled(ops=["add"]):
        first = x + y
        first_inplace = y.clone()
        first_inplace += x
        monkeypatch.setattr(routing, "_add_why", lambda *a: pytest.fail("a repeat re-ran the checks"))
        sums, inplace = [], []
        for _ in range(3):
            a, b = torch.randn(6, 8, device=device), torch.randn(6, 8, device=device)
            with Unchanged(a, b):
                sums.append((a + b, a, b))
            buf = torch.randn(6, 8, device=device)
            before = buf.clone()  # a copy, not an add
            buf += b
            inplace.append((buf, before, b))
        monkeypatch.undo()
        strided = x + t
        scaled = x.add(y, alpha=3)
        row = torch.randn(2, 48, device=device)
        dst, src = row[0, 1:41].view(5, 8), row[0, :40].view(5, 8)
        with Unchanged(row), pytest.raises(RuntimeError, match="refer to a single memory location"):
            dst += src  # the signature of a disjoint pair, partially overlapping: aten's error
    torch.testing.assert_close(first, x + y)
    torch.testing.assert_close(first_inplace, x + y)
    for got, a, b in sums + inplace:
        torch.testing.assert_close(got, (a.double() + b.double()).float())
    torch.testing.assert_close(scaled, x + 3 * y)
    assert strided.stride() == (x + t).stride()
    torch.testing.assert_close(strided, x + t)
    counts = xkernels.routing_counts()
    assert counts["add.Tensor"]["xkernels"] == 1 + 3 + 1  # first, the repeats, alpha=3
    assert counts["add.Tensor"]["aten: non-contiguous operand"] == 1
    assert counts["add_.Tensor"]["xkernels"] == 1 + 3
    assert counts["add_.Tensor"]["aten: xkernels refused (ValueError)"] == 1  # the overlapping one
