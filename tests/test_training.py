"""Training through xkernels: 10 optimiser steps of a patched model (and of an unmodified one under
``enable()``) follow PyTorch's loss curve, with gradient checkpointing too; a patched model compiles
with ``fullgraph=True``."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import xkernels
from helpers import assert_model_close, require_transformers
from xkernels import routing

STEPS = 10


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.SiLU(),
                               torch.nn.Linear(32, 32), torch.nn.LeakyReLU(0.1), torch.nn.Linear(32, 4))


def _tiny_bert() -> torch.nn.Module:
    transformers = require_transformers()
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=50, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg)


def _curve(model: torch.nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], opt_name: str,
           forward=None) -> torch.Tensor:
    """Loss of each of ``STEPS`` optimiser steps (the optimiser is built before any patching)."""
    opt = (torch.optim.Adam(model.parameters(), lr=1e-2) if opt_name == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    forward = forward or (lambda m, x: m(x))
    losses = []
    for x, target in data:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(model, x), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _three_curves(make, data, opt_name, dtype64_data, forward=None, route=None):
    torch_model = make()
    model64, model = copy.deepcopy(torch_model).double(), copy.deepcopy(torch_model)
    want = _curve(torch_model, data, opt_name, forward)
    ref64 = _curve(model64, dtype64_data, opt_name, forward)
    return model, want, ref64


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_mlp_loss_curve_with_patch(backend, device, opt_name):
    data = [(torch.randn(16, 12, device=device), torch.randn(16, 4, device=device))] * STEPS  # one batch, fitted
    data64 = [(x.double(), t.double()) for x, t in data]
    model, want, ref64 = _three_curves(lambda: _mlp().to(device), data, opt_name, data64)
    report = xkernels.patch(model)
    assert len(report.fused) == 3 and report.left == []
    got = _curve(model, data, opt_name)
    assert_model_close(got, want, ref64)
    assert got[-1] < got[0], "training did not reduce the loss"


@pytest.mark.parametrize("route", ["planned", "vendor BLAS"])
def test_mlp_loss_curve_under_enable(backend, device, route, monkeypatch):
    """Ten training steps with enable() on; "vendor BLAS": every matmul/linear class measured
    faster on the device's BLAS (the route of small shapes on cuda), so repeats go to aten's
    kernel directly and first calls come back through the override as re-entrant ones."""
    from helpers import every_matmul_to_vendor

    data = [(torch.randn(16, 12, device=device), torch.randn(16, 4, device=device)) for _ in range(STEPS)]
    data64 = [(x.double(), t.double()) for x, t in data]
    model, want, ref64 = _three_curves(lambda: _mlp().to(device), data, "adam", data64)
    xkernels.routing_counts(reset=True)
    with contextlib.ExitStack() as stack:
        if route == "vendor BLAS":
            stack.enter_context(every_matmul_to_vendor(monkeypatch))
        with xkernels.enabled():
            got = _curve(model, data, "adam")
    assert_model_close(got, want, ref64)
    if backend.runs_triton:  # every addmm took xkernels' route (which may be the device's BLAS, as aten)
        counts = xkernels.routing_counts()["addmm"]
        with contextlib.ExitStack() as stack:
            if route == "vendor BLAS":
                stack.enter_context(every_matmul_to_vendor(monkeypatch))
            vendor = any(xkernels.ops.linear.explain(torch.empty(16, m.in_features, device=device), m.weight,
                                                     m.bias).route == "vendor BLAS"
                         for m in model.modules() if isinstance(m, torch.nn.Linear))
        if not vendor:  # every layer runs a kernel: each call is xkernels', none re-entrant
            assert counts == {"xkernels": 4 * STEPS}, counts
        reentrant = counts.pop("aten: re-entrant call", 0)
        assert set(counts) <= {"xkernels", routing.VENDOR_WHY}, counts
        assert sum(counts.values()) == 4 * STEPS, counts
        assert reentrant <= counts.get("xkernels", 0)
        if route == "vendor BLAS":
            assert counts.get(routing.VENDOR_WHY, 0) > 0, counts


def test_tiny_bert_loss_curve_with_patch(backend, device):
    ids = [torch.randint(0, 50, (2, 6), device=device) for _ in range(STEPS)]
    data = [(i, torch.randn(2, 6, 32, device=device)) for i in ids]
    data64 = [(i, t.double()) for i, t in data]
    forward = lambda m, x: m(x).last_hidden_state
    model, want, ref64 = _three_curves(lambda: _tiny_bert().to(device), data, "adam", data64, forward)
    report = xkernels.patch(model)
    assert len(report.fused) == 1
    got = _curve(model, data, "adam", forward)
    assert_model_close(got, want, ref64)


@pytest.mark.parametrize("linears", ["xkernels", "pytorch"])
def test_tiny_bert_loss_curve_with_patch_and_checkpointing(backend, device, monkeypatch, linears):
    """transformers' non-reentrant gradient checkpointing on a patched model: each layer's forward
    is recomputed in the backward, and torch.utils.checkpoint fails where the recomputation saves
    other tensors than the forward did (a first call's Python path against a repeat's native
    grad_fn). The loss curve follows PyTorch's (without checkpointing), with the linears' training
    calls through xkernels or given to PyTorch's ops (``linears``, the training policy's two
    answers)."""
    from xkernels import nn as xnn

    if linears == "pytorch":
        monkeypatch.setattr(xnn, "_trains_through_xkernels", lambda x, w: False)
    ids = [torch.randint(0, 50, (2, 6), device=device) for _ in range(STEPS)]
    data = [(i, torch.randn(2, 6, 32, device=device)) for i in ids]
    data64 = [(i, t.double()) for i, t in data]
    forward = lambda m, x: m(x).last_hidden_state
    model, want, ref64 = _three_curves(lambda: _tiny_bert().to(device), data, "adam", data64, forward)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert len(xkernels.patch(model).fused) == 1
    got = _curve(model, data, "adam", forward)
    assert_model_close(got, want, ref64)


def test_patched_model_compiles_fullgraph(backend, device):
    """torch.compile(fullgraph=True) traces a patched model without a graph break (aot_eager: the
    graph runs eagerly) and gives the eager result and gradients."""
    torch._dynamo.reset()
    model = _mlp().to(device)
    xkernels.patch(model)
    x = torch.randn(8, 12, device=device, requires_grad=True)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(compiled, eager)
    (g_eager,) = torch.autograd.grad(eager.sum(), x)
    (g_compiled,) = torch.autograd.grad(compiled.sum(), x)
    torch.testing.assert_close(g_compiled, g_eager)


def test_patched_linears_trace_as_pytorch_linear_under_compile(backend, device):
    """While torch.compile traces, a patched linear layer is PyTorch's F.linear and activation
    (Inductor fuses them; the custom op's runtime Python cost made compiled patched models slower
    on an H100): the traced graph holds no xkernels node, and the result matches eager."""
    torch._dynamo.reset()
    model = _mlp().to(device)
    report = xkernels.patch(model)
    assert report.fused or report.replaced
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    x = torch.randn(8, 12, device=device)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True, backend=recording)(x)
    torch._dynamo.reset()
    assert targets and not [t for t in targets if "xkernels" in t], targets
    assert any("linear" in t for t in targets), targets
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


_DECODERS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                                      max_position_embeddings=64)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64,
                                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
}


_COMPILED = {**_DECODERS,
             "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_DECODERS["llama"][2], head_dim=8,
                                                               hidden_act="gelu_pytorch_tanh")),
             "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(_DECODERS["llama"][2], pad_token_id=0))}


@pytest.mark.parametrize("family", list(_COMPILED))
def test_patched_decoders_compile_fullgraph(family):
    """A patched decoder LM (decoder-layer add + norm, gated MLP and rotary fusions; GPT-2's blocks)
    traces under torch.compile(fullgraph=True) without a graph break, for inference and for a
    training step (aot_eager), and gives the eager output and gradients: what the fused forwards
    consult while Dynamo traces (``block_steps.GatedStep.compiled`` included) is traceable."""
    tf = require_transformers()
    cfg_name, model_name, kwargs = _COMPILED[family]
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = getattr(tf, model_name)(getattr(tf, cfg_name)(**kwargs, attn_implementation="eager"))
    assert xkernels.patch(model).blocks
    ids = torch.randint(3, 64, (2, 7))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits)
    got = compiled(ids).logits
    want = model(ids).logits
    torch.testing.assert_close(got, want)
    params = [p for p in model.parameters() if p.requires_grad]
    for g, w in zip(torch.autograd.grad(got.square().mean(), params), torch.autograd.grad(want.square().mean(), params)):
        torch.testing.assert_close(g, w)
    torch._dynamo.reset()


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("family", list(_DECODERS))
def test_patched_decoders_train_with_checkpointing(backend, device, family, reentrant):
    """Gradient checkpointing (both of torch.utils.checkpoint's modes) on a patched decoder LM:
    the decoder-layer add + norm, gated MLP and rotary fusions (Llama), the feed-forward block
    and norms (GPT-2) are recomputed in the backward: each layer's forward runs twice per step.
    The first step (each signature's first call) and the second (repeats) give PyTorch's output
    and gradients without checkpointing."""
    tf = require_transformers()
    cfg_name, model_name, kwargs = _DECODERS[family]
    cfg = getattr(tf, cfg_name)(**kwargs)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(tf, model_name)(cfg).to(device).train()
    ref64 = copy.deepcopy(model).double()
    ids = torch.randint(3, 64, (2, 7), device=device)

    def step(m):
        m.zero_grad(set_to_none=True)
        y = m(ids).logits
        y.double().square().mean().backward()
        return y.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}

    want, ref = step(model), step(ref64)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    report = xkernels.patch(model)
    assert report.blocks, report
    # each layer's forward runs again in the backward: counted at its attention, called from the
    # layer's forward (a fused forward set on the instance must keep the class's checkpointing)
    layers = [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block"))]
    assert layers and all("forward" in m.__dict__ for m in layers), report
    calls = []
    for layer in layers:
        attn = layer._modules.get("self_attn") or layer._modules["attn"]
        attn.register_forward_pre_hook(lambda m, args, kwargs, layer=layer: calls.append(layer), with_kwargs=True)
    for _ in range(2):
        calls.clear()
        got = step(model)
        assert len(calls) == 2 * len(layers), f"{len(calls)} attention calls for {len(layers)} checkpointed layers"
        assert_model_close(got[0], want[0], ref[0])
        assert got[1].keys() == want[1].keys()
        for n in want[1]:
            try:
                assert_model_close(got[1][n], want[1][n], ref[1][n])
            except AssertionError as e:
                raise AssertionError(f"gradient of {n}: {e}") from None
