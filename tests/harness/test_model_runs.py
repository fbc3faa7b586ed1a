"""The bench's model modes: CUDA graphs of the forward and of the training step replay what the
eager model computes (on cuda; elsewhere the mode says why it cannot run)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import xkernels
from helpers import require_transformers
from xkernels.harness import Target, model_zoo
from xkernels.harness.model_runs import Runner, make_runner, unavailable_reason


@pytest.mark.parametrize("way", ["torch", "patch"])
def test_cudagraph_replays_forward_and_training_step(backend, device, way):
    require_transformers()
    target = Target(backend, device)
    if device.type != "cuda":
        why = unavailable_reason("cudagraph", target)
        assert why is not None and why.startswith(f"CUDA graphs need a cuda device (torch.cuda.CUDAGraph); "
                                                  f"this run is on {device} (backend {backend.name!r})")
        with pytest.raises(RuntimeError, match="CUDA graphs need a cuda device"):
            make_runner("cudagraph", torch.nn.Linear(2, 2), {}, target)
        return
    built = model_zoo.build(model_zoo.zoo_config("llama", "tiny"), "llama", torch.float32, device, batch=2, seq=8,
                            zoo_name="llama", size="tiny")
    model, inputs = built.model, built.inputs
    report = xkernels.patch(model) if way == "patch" else None
    try:
        graphed = make_runner("cudagraph", model, inputs, target)
        # the graph reads its static input: fresh ids copied in are what the replays compute on
        inputs["input_ids"].copy_(torch.randint(0, model.config.vocab_size, inputs["input_ids"].shape, device=device))
        poison = graphed.fwd_out.fill_(float("nan"))
        out = graphed.forward()
        assert out is poison and not out.isnan().any()
        out = out.clone()
        graphed.train_step()
        grads = {n: g.clone() for n, g in graphed.grads().items() if g is not None}
        eager = Runner(model, inputs)
        want = eager.forward()
        eager.train_step()
        want_grads = {n: g for n, g in eager.grads().items() if g is not None}
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
        assert sorted(grads) == sorted(want_grads) and len(grads) == len(list(model.parameters()))
        for n, g in want_grads.items():
            torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
        graphed.release()
        assert all(p.grad is None for p in model.parameters())
    finally:
        if report is not None:
            report.undo()


def test_unknown_mode_is_a_value_error():
    target = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    with pytest.raises(ValueError, match=r"--mode must be among \['eager', 'cudagraph', 'compile'\], got 'graph'"):
        unavailable_reason("graph", target)
    assert unavailable_reason("eager", target) is None and unavailable_reason("compile", target) is None


@contextlib.contextmanager
def _sdpa_masks():
    """(attn_mask given, is_causal) of each scaled_dot_product_attention call while active."""
    seen: list[tuple[bool, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        seen.append((mask is not None, bool(kwargs.get("is_causal", False))))
        return sdpa(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = recording
    try:
        yield seen
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa


def _tiny(name: str):
    return model_zoo.build(model_zoo.zoo_config(name, "tiny"), name, torch.float32, torch.device("cpu"),
                           zoo_name=name, size="tiny")


@pytest.mark.parametrize("name", ["bert-base", "llama"])
def test_captured_bodies_take_the_eager_attention_path(name, monkeypatch):
    """What the cudagraph mode captures runs SDPA as the eager call does (unmasked; causal for
    Llama) while a capture is under way: here torch.cuda.is_current_stream_capturing answers
    True, as it does during torch.cuda.graph, which transformers' is_tracing() consults."""
    require_transformers()
    from xkernels.harness.model_runs import captured_forward, captured_step

    built = _tiny(name)
    model, inputs = built.model, built.inputs
    model.eval()
    with _sdpa_masks() as eager, torch.no_grad():
        want = Runner(model, inputs).forward()
    assert eager and not any(masked for masked, _ in eager)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with _sdpa_masks() as seen, torch.no_grad():
        got = captured_forward(model, inputs)
    assert seen == eager
    torch.testing.assert_close(got, want)
    model.train()
    model.zero_grad(set_to_none=True)
    with _sdpa_masks() as seen:
        loss = captured_step(model, inputs)
    assert seen == eager
    assert loss.grad_fn is None and not loss.requires_grad  # detached: no autograd graph kept alive
    assert any(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", ["bert-base", "llama"])
def test_compiled_runner_traces_the_eager_attention_path(name, monkeypatch):
    """The compile mode's graphs (forward and training step, as make_runner compiles them) hold
    SDPA unmasked, as the eager call runs it: dynamo (on torch < 2.14 its is_exporting() reads
    True while tracing) must not make transformers materialize the mask. The graphs are read by
    a recording dynamo backend in place of inductor."""
    require_transformers()
    built = _tiny(name)
    with _sdpa_masks() as eager, torch.no_grad():
        Runner(built.model.eval(), built.inputs).forward()
    traced: list[tuple[bool, bool]] = []

    def recording_backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if "scaled_dot_product_attention" in str(node.target):
                mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
                traced.append((mask is not None, bool(node.kwargs.get("is_causal", False))))
        return gm.forward

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: compile_(model, backend=recording_backend))
    target = Target(xkernels.get_backend("cpu"), torch.device("cpu"))
    torch._dynamo.reset()
    try:
        runner = make_runner("compile", built.model, built.inputs, target)
        calls = len(traced)
        runner.forward()
        runner.train_step()
        assert len(traced) == calls, "a later call retraced"
    finally:
        torch._dynamo.reset()
    layers = len(eager)
    assert traced and len(traced) % layers == 0
    assert traced == eager * (len(traced) // layers)
