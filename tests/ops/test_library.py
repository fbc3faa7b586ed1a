"""The ops as ``torch.library`` custom ops (``ops/library.py``): ``torch.compile(fullgraph=True)``,
``torch.export``, fake implementations and the registrations PyTorch's ``opcheck`` tests."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import xkernels
from helpers import assert_close, assert_model_close, nudged, poisoned, rand
from xkernels.ops import add, broadcast, linear, matmul
from xkernels.ops.matmul.vendor import reference_linear


def block(x, y, w, b):
    """Every op and call form: keywords, Python scalars on either side, alpha, out-less."""
    h = add(x, y, alpha=2) * 2
    h = broadcast(h, y)
    h = add(add(h, 1.5), add(0.5, h, alpha=-0.5))  # = 0.5 h + 2: h still reaches the gradients of x, y
    h = linear(h, w, bias=b, activation="gelu")
    h = linear(h, w.t().contiguous()[: h.shape[-1]].t(), None, "leaky_relu", negative_slope=0.3)
    return matmul(h, h.mT)


def _inputs(device, requires_grad=False):
    x, y = rand((2, 4, 6), torch.float32, device), rand((6,), torch.float32, device)
    w, b = rand((6, 6), torch.float32, device), rand((6,), torch.float32, device)
    return [t.requires_grad_(requires_grad) for t in (x, y, w, b)]


#: PyTorch float32 runs (the inputs', then nudged ones) whose largest error scales the tolerance.
#: With one, about 1 seed in 80 failed, and PyTorch's own nudged run failed against its first in
#: 2.5% of cases: the block's tensors are small and its rows repeat, so one run's error is one
#: noisy draw. With 9, 512 seeds each pass on interpreter and interpreter-npu, at half the allowed.
TORCH_DRAWS = 9


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run_with_grads(fn, inputs):
    for t in inputs:
        t.grad = None
    out = fn(*inputs)
    out.sum().backward()
    return out.detach(), [t.grad.clone() for t in inputs]


def test_fullgraph_compile_matches_eager_with_gradients(backend, device):
    """The compiled block and the eager one, result and every input's gradient, each against the
    float64 run within the model tolerance (``assert_model_close``: a multiple of PyTorch's own
    float32 error, the largest over ``TORCH_DRAWS`` runs). The two need not agree bit for bit: where
    a gradient is required, eager ``linear(..., "gelu")`` runs linear + PyTorch's gelu (keeping the
    pre-activation), while the compiled custom op is one fused node whose backward recomputes it."""
    inputs = _inputs(device, requires_grad=True)
    got, got_grads = _run_with_grads(torch.compile(block, fullgraph=True, backend="aot_eager"), inputs)
    eager, eager_grads = _run_with_grads(block, inputs)
    runs = []  # (PyTorch's float32 [result, *grads], float64's) of the block on the inputs, then on nudged ones
    with xkernels.use_backend("cpu"):
        for i in range(TORCH_DRAWS):
            moved = [t.detach().cpu() for t in inputs] if i == 0 else nudged(inputs)
            f32 = _run_with_grads(block, [t.clone().requires_grad_() for t in moved])
            f64 = _run_with_grads(block, [t.double().requires_grad_() for t in moved])
            runs.append(([f32[0], *f32[1]], [f64[0], *f64[1]]))
    (torch_all, ref_all), draws = runs[0], runs[1:]
    assert got.shape == eager.shape == ref_all[0].shape
    for mine in ([got, *got_grads], [eager, *eager_grads]):
        for i, (g, t, r) in enumerate(zip(mine, torch_all, ref_all)):
            assert_model_close(g, t, r, [(d[0][i], d[1][i]) for d in draws])


def test_compiled_graph_holds_one_node_per_call(backend, device):
    seen = []

    def count(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    with torch.no_grad():
        torch.compile(block, fullgraph=True, backend=count)(*_inputs(device))
    xk = [s for s in seen if "xkernels" in s]
    assert len(xk) == 8, seen  # add, broadcast, add x3, linear x2, matmul
    assert {"xkernels.add.default", "xkernels.add.Scalar", "xkernels.add.ScalarTensor", "xkernels.broadcast.default",
            "xkernels.linear.default", "xkernels.matmul.default"} <= set(xk)


def test_compiled_out_copies_and_checks(backend, device):
    x, y = rand((3, 5), torch.float32, device), rand((5,), torch.float32, device)
    fn = torch.compile(lambda x, y, o: add(x, y, alpha=3, out=o), fullgraph=True, backend="aot_eager")
    out = poisoned((3, 5), torch.float32, device)
    assert fn(x, y, out) is out
    assert_close(out, x.double() + 3 * y.double(), torch.float32)
    # torch 2.13 re-raises the op's ValueError; torch 2.11's Dynamo reports it inside its own error
    # (the pieces of the message, quoted), so the pattern spans both
    with pytest.raises(Exception, match=r"(?s)'out\W* has shape .*the result has shape .*\(3, 5\)"):
        fn(x, y, poisoned((2, 5), torch.float32, device))


def test_bad_input_raises_the_ops_error_while_tracing(backend, device):
    fn = torch.compile(lambda a, b: matmul(a, b), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"inner dimensions differ: 'a' \(4, 6\) @ 'b' \(5, 6\)"):
        fn(rand((4, 6), torch.float32, device), rand((5, 6), torch.float32, device))


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export(backend, device, strict):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(rand((5, 6), torch.float32, device))
            self.b = torch.nn.Parameter(rand((5,), torch.float32, device))

        def forward(self, x, y):
            return matmul(linear(add(x, y, alpha=0.5), self.w, self.b, "silu"), self.w)

    m = Block()
    x, y = rand((4, 6), torch.float32, device), rand((6,), torch.float32, device)
    ep = torch.export.export(m, (x, y), strict=strict)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets == ["xkernels.add.default", "xkernels.linear.default", "xkernels.matmul.default"]
    x2, y2 = rand((4, 6), torch.float32, device), rand((6,), torch.float32, device)
    with torch.no_grad():
        got = ep.module()(x2, y2)
        h = reference_linear((x2 + 0.5 * y2).double(), m.w.double(), m.b.double(), "silu")
    assert_close(got, h @ m.w.double(), torch.float32, scale=10)


FAKE_CASES = [  # (xkernels op, torch op, args, kwargs)
    (torch.ops.xkernels.add.default, torch.add, ((5, 1, 7, "f16"), (3, 7, "f32")), {"alpha": 2}),
    (torch.ops.xkernels.add.default, torch.add, ((4, "i32"), (4, "f16")), {}),
    (torch.ops.xkernels.add.default, torch.add, (("f32",), (2, 3, "bf16")), {}),
    (torch.ops.xkernels.add.Scalar, torch.add, ((4, 3, "i32"), 2.5), {"alpha": 2}),
    (torch.ops.xkernels.add.Scalar, torch.add, ((4, 3, "i64"), 7), {}),
    (torch.ops.xkernels.add.ScalarTensor, None, (1.5, (4, 3, "f16")), {}),
    (torch.ops.xkernels.broadcast.default, torch.add, ((2, 3, 4, 5, "bf16"), (3, 1, 1, "bf16")), {}),
    (torch.ops.xkernels.matmul.default, torch.matmul, ((9, "f32"), (9, "f32")), {}),
    (torch.ops.xkernels.matmul.default, torch.matmul, ((9, "f16"), (2, 9, 5, "f16")), {}),
    (torch.ops.xkernels.matmul.default, torch.matmul, ((2, 1, 6, 9, "bf16"), (3, 9, 5, "bf16")), {}),
    (torch.ops.xkernels.matmul.default, torch.matmul, ((2, 3, 6, 9, "f32"), (9, "f32")), {}),
    (torch.ops.xkernels.linear.default, torch.nn.functional.linear, ((2, 3, 9, "bf16"), (4, 9, "bf16"), (4, "bf16")),
     {}),
    (torch.ops.xkernels.linear.default, torch.nn.functional.linear, ((9, "f32"), (4, 9, "f32")), {}),
]
_DT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32, "i64": torch.int64}


@pytest.mark.parametrize("op,torch_op,args,kwargs", FAKE_CASES, ids=lambda v: str(v) if isinstance(v, tuple) else None)
def test_fake_shapes_and_dtypes_are_torchs(op, torch_op, args, kwargs):
    with FakeTensorMode():
        real = tuple(torch.empty(a[:-1], dtype=_DT[a[-1]]) if isinstance(a, tuple) else a for a in args)
        got = op(*real, **kwargs)
        if torch_op is None:  # Python number first: torch.add wants a tensor there
            want = torch.add(torch.tensor(real[0]), real[1], **kwargs)
        else:
            want = torch_op(*real, **kwargs)
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device)
    assert got.is_contiguous()


OPCHECK = [
    (torch.ops.xkernels.add.default, lambda d: (rand((4, 5), torch.float32, d), rand((5,), torch.float32, d)),
     {"alpha": 2.0}),
    (torch.ops.xkernels.add.Scalar, lambda d: (rand((4, 5), torch.float32, d), 3), {"alpha": -1}),
    (torch.ops.xkernels.add.ScalarTensor, lambda d: (0.5, rand((4, 5), torch.float32, d)), {}),
    (torch.ops.xkernels.broadcast.default, lambda d: (rand((2, 3, 4), torch.float32, d), rand((3, 1), torch.float32, d)),
     {}),
    (torch.ops.xkernels.matmul.default, lambda d: (rand((2, 4, 5), torch.float32, d), rand((5, 3), torch.float32, d)),
     {}),
    (torch.ops.xkernels.linear.default, lambda d: (rand((4, 5), torch.float32, d), rand((3, 5), torch.float32, d),
                                                   rand((3,), torch.float32, d), "gelu", 0.01), {}),
]


@pytest.mark.parametrize("op,make,kwargs", OPCHECK, ids=lambda v: str(v) if not callable(v) or hasattr(v, "_schema")
                         else None)
def test_opcheck(backend, device, op, make, kwargs):
    """PyTorch's consistency tests of a custom op: schema, fake impl, autograd registration,
    AOT dispatch (with dynamic shapes)."""
    args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) else a for a in make(device))
    torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("op", ["linear", "add_layer_norm", "add_rms_norm", "gated_linear"])
def test_backward_of_a_call_without_its_default_arguments(backend, device, op):
    """A compiled graph calls a custom op without the arguments left at their defaults (FX drops
    them: a bias-less ``lm_head`` under torch.compile, found on an H100): its backward gets fewer
    ``needs_input_grad`` entries than the schema has, and must still compute every gradient."""
    import xkernels.ops  # noqa: F401 - registers the custom ops

    x = rand((5, 16), torch.float32, device).requires_grad_()
    w = rand((12 if op != "add_layer_norm" and op != "add_rms_norm" else 16,) if op.startswith("add_") else (12, 16),
             torch.float32, device).requires_grad_()
    if op == "linear":
        got = torch.ops.xkernels.linear.default(x, w)
        want = lambda x, w: x @ w.T  # noqa: E731
    elif op == "gated_linear":
        u = rand((12, 16), torch.float32, device).requires_grad_()
        got = torch.ops.xkernels.gated_linear.default(x, w, u)
        want = lambda x, w: torch.nn.functional.silu(x @ w.T) * (x @ u.detach().double().T)  # noqa: E731
    else:
        r = rand((5, 16), torch.float32, device)
        got = getattr(torch.ops.xkernels, op).default(x, r, w)[0]
        if op == "add_layer_norm":
            want = lambda x, w: torch.nn.functional.layer_norm(x + r.double(), (16,), w)  # noqa: E731
        else:
            want = lambda x, w: torch.nn.functional.rms_norm(x + r.double(), (16,), w, 1e-6)  # noqa: E731
    dy = rand(got.shape, torch.float32, device)
    gx, gw = torch.autograd.grad(got, (x, w), dy)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ex, ew = torch.autograd.grad(want(xd, wd), (xd, wd), dy.double())
    for g, e in ((gx, ex), (gw, ew)):  # fp32 gradients of 16-term sums against float64
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4 * e.abs().max().item())
