"""The bench's model modes: CUDA graphs of the forward and of the training step replay what the
eager model computes (on cuda; elsewhere the mode says why it cannot run)."""

from __future__ import annotations

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
