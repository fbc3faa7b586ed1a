"""The host path of calls that require a gradient: a repeat finds its signature's route once (the
op's front door) or not at all (a module's or block step's own ``RouteCache``), runs that route in
its autograd forward, and computes what torch's autograd computes. Also the per-signature answers
kept on the fused norm's backward (``row_stride``). ``tools/probes/host_training.py`` measures it."""

from __future__ import annotations

import copy

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close, rand, require_transformers
from xkernels.ops import add_rms_norm, gated_linear, linear
from xkernels.ops.fused import add_norm_plan
from xkernels.ops.matmul.vendor import reference_linear
from xkernels.ops.op import Op


class Lookups:
    """Counts signature lookups (``Op._lookup``) and full paths (``Op._full_path``) per op name."""

    def __init__(self, monkeypatch):
        self.lookups: list[str] = []
        self.full: list[str] = []
        lookup, full = Op._lookup, Op._full_path
        monkeypatch.setattr(Op, "_lookup", lambda op, a, k: (self.lookups.append(op.name), lookup(op, a, k))[1])
        monkeypatch.setattr(Op, "_full_path", lambda op, a, k: (self.full.append(op.name), full(op, a, k))[1])

    def clear(self):
        self.lookups.clear()
        self.full.clear()


def _linear_ref(x, w, b, activation, slope):
    """(y, dx, dw, db) of ``act(x @ w.T + b)``, float64, for the upstream gradient ``g``."""
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    return xd, wd, bd, reference_linear(xd, wd, bd, activation, slope)


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_op_call_with_grad_looks_its_route_up_once(backend, device, activation, monkeypatch):
    """``linear(..., negative_slope=...)`` with a weight requiring grad: a repeat looks its
    signature up once (it did twice: the recorded call, then again in the autograd forward; gelu
    runs ``linear`` unfused + torch's gelu: the gelu signature has no route, a miss, then one
    lookup of the unfused call; it did three) and takes no full path; output and gradients match
    float64 torch."""
    x = rand((6, 16), torch.float32, device)
    w = rand((24, 16), torch.float32, device).requires_grad_()
    b = rand((24,), torch.float32, device).requires_grad_()
    g = rand((6, 24), torch.float32, device)
    linear(x, w, b, activation, negative_slope=0.1).backward(g)  # plans and leaves the routes
    count = Lookups(monkeypatch)
    for _ in range(2):
        count.clear()
        w.grad = b.grad = None
        with Unchanged(x, g):
            y = linear(x, w, b, activation, negative_slope=0.1)
            y.backward(g)
        if backend.runs_triton:  # (a backend running PyTorch has no routes: the full path each call)
            assert count.lookups.count("linear") == (2 if activation == "gelu" else 1), count.lookups
            assert not count.full, count.full
    xd, wd, bd, ref = _linear_ref(x, w, b, activation, 0.1)
    ref.backward(g.double())
    assert_close(y.detach(), ref.detach(), torch.float32, scale=10)
    assert_close(w.grad, wd.grad, torch.float32, scale=10)
    assert_close(b.grad, bd.grad, torch.float32, scale=10)


def test_a_declining_route_in_the_autograd_forward_takes_the_full_path(backend, device, monkeypatch, request):
    """The route handed to the autograd forward returns ``None`` (a per-call precondition
    failed): the forward takes the op's own path and the result is still right."""
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no routes")
    # a kernel route, as a measured rule gives it (on cuda this fp32 class's table rule is the BLAS)
    from xkernels.ops.matmul import config as matmul_config

    rule = matmul_config.Selection({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4,
                                    "num_stages": 2}, "a test rule", "measured faster", True,
                                   record={"worst_ratio": 1.2})
    monkeypatch.setattr(matmul_config, "select", lambda *a, **k: rule)
    monkeypatch.setattr(backend, "kernel_needs_evidence", False, raising=False)
    linear._forget()
    request.addfinalizer(linear._forget)  # no route made here outlives the test
    x = rand((5, 8), torch.float32, device)
    w = rand((12, 8), torch.float32, device).requires_grad_()
    linear(x, w, None, "leaky_relu", negative_slope=0.01)
    route = linear.repeat_route(x, w, None, "leaky_relu", negative_slope=0.01)
    assert route is not None and not route.records_autograd
    declined = []
    monkeypatch.setattr(route, "run", lambda *a: declined.append(1))  # returns None
    y = linear(x, w, None, "leaky_relu", negative_slope=0.01)
    assert declined, "the autograd forward did not run the route it was handed"
    y.sum().backward()
    _, wd, _, ref = _linear_ref(x, w, torch.zeros(12, device=device), "leaky_relu", 0.01)
    ref.sum().backward()
    assert_close(y.detach(), ref.detach(), torch.float32, scale=10)
    assert_close(w.grad, wd.grad, torch.float32, scale=10)


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_module_with_grad_repeats_without_the_op_lookup(backend, device, activation, monkeypatch):
    """``xkernels.nn.Linear`` in training: a repeat finds its route in the module's own cache (no
    op lookup, no full path); another input shape is another key (a miss that computes right and
    is then kept); gelu (unfused where a gradient is required) too; gradients match float64
    torch each time."""
    torch_layer = torch.nn.Linear(16, 20, device=device)
    layer = xkernels.nn.Linear.from_linear(copy.deepcopy(torch_layer), activation)
    count = Lookups(monkeypatch)
    for shape in [(3, 4, 16), (3, 4, 16), (7, 16), (7, 16)]:
        x = rand(shape, torch.float32, device)
        g = rand((*shape[:-1], 20), torch.float32, device)
        count.clear()
        layer.zero_grad(set_to_none=True)
        y = layer(x)
        y.backward(g)
        xd, wd, bd, ref = _linear_ref(x, layer.weight, layer.bias, activation, 0.01)
        ref.backward(g.double())
        assert_close(y.detach(), ref.detach(), torch.float32, scale=10)
        assert_close(layer.weight.grad, wd.grad, torch.float32, scale=10)
        assert_close(layer.bias.grad, bd.grad, torch.float32, scale=10)
    if backend.runs_triton:
        count.clear()
        layer(rand((7, 16), torch.float32, device)).sum().backward()
        assert "linear" not in count.lookups + count.full, (count.lookups, count.full)


def test_rms_norm_and_gated_mlp_steps_with_grad_skip_the_op_lookup(backend, device, monkeypatch):
    """A patched Llama in training: the decoder layers' add+RMSNorm steps and the gated MLPs run
    their routes from the steps' own caches (no ``add_rms_norm`` / ``gated_linear`` lookup on a
    repeat); logits and every gradient match the unpatched model's. gated_linear's training calls
    leave no route: its step's cache remembers that, also where the op holds another signature's
    route (made first here, as an earlier call of the process would)."""
    tf = require_transformers()
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(2):
            gated_linear(rand((5, 16), torch.float32, device), rand((12, 16), torch.float32, device),
                         rand((12, 16), torch.float32, device))
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=32,
                         attn_implementation="eager")
    model = tf.LlamaForCausalLM(cfg).to(device)
    ref = copy.deepcopy(model).double()
    xkernels.patch(model)
    ids = torch.randint(0, 64, (2, 7), device=device)

    def step(m):
        m.zero_grad(set_to_none=True)
        out = m(ids).logits
        out.float().square().mean().backward()
        return out, [p.grad for p in m.parameters()]

    step(model)
    step(model)  # (a signature or two first runs with a gradient on the second step)
    count = Lookups(monkeypatch)
    got, grads = step(model)
    if backend.runs_triton:
        assert "add_rms_norm" not in count.lookups and "gated_linear" not in count.lookups, count.lookups
        assert not count.full, count.full
    want, want_grads = step(ref)
    assert_close(got.detach(), want.detach(), torch.float32, scale=20)
    for a, b in zip(grads, want_grads):
        assert_close(a, b, torch.float32, scale=20)


def test_add_rms_norm_with_grad_looks_up_once(backend, device, monkeypatch):
    """The op's own recorded call: one lookup per repeat (``AddNormOp.record``)."""
    x = rand((4, 24), torch.float32, device).requires_grad_()
    r = rand((4, 24), torch.float32, device)
    w = rand((24,), torch.float32, device).requires_grad_()
    add_rms_norm(x, r, w, 1e-6, offset=0.0)
    count = Lookups(monkeypatch)
    y, s = add_rms_norm(x, r, w, 1e-6, offset=0.0)
    (y.sum() + s.sum()).backward()
    if backend.runs_triton:
        assert count.lookups.count("add_rms_norm") == 1 and not count.full, (count.lookups, count.full)
    sd = (x.detach() + r).double().requires_grad_()
    wd = w.detach().double().requires_grad_()
    yd = sd * torch.rsqrt(sd.square().mean(-1, keepdim=True) + 1e-6) * wd
    (yd.sum() + sd.sum()).backward()
    assert_close(x.grad, sd.grad, torch.float32, scale=20)
    assert_close(w.grad, wd.grad, torch.float32, scale=20)


def test_row_stride_kept_per_layout_and_target(device, monkeypatch):
    """``row_stride`` answers as computed afresh for every layout (contiguous, broadcast row,
    transposed, sliced, 0-d), on repeats too, and computes each (shape, strides, target) once."""
    add_norm_plan._row_strides.clear()
    base = torch.randn(6, 8, device=device)
    cases = [(base, (6, 8)), (base[:, :4], (6, 4)), (base.t(), (8, 6)), (base[0], (6, 8)), (base[::2], (3, 8)),
             (torch.randn(1, 8, device=device), (5, 8)), (torch.tensor(1.0, device=device), ()),
             (torch.randn(2, 3, 8, device=device)[:, 1:], (2, 2, 8)), (base, (2, 6, 8))]
    want = [add_norm_plan._row_stride(t, torch.Size(s)) for t, s in cases]
    assert None in want and len(set(want)) > 3  # the cases differ
    computed = []
    real = add_norm_plan._row_stride
    monkeypatch.setattr(add_norm_plan, "_row_stride", lambda t, s: (computed.append(1), real(t, s))[1])
    for _ in range(2):
        assert [add_norm_plan.row_stride(t, torch.Size(s)) for t, s in cases] == want
    assert len(computed) == len(cases)
