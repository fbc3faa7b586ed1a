"""``patch()``'s routed experts forward (``xkernels/experts_forward.py``): under transformers'
``grouped_mm`` experts implementation the tokens' gather and the weighted sum run as
``ops/fused/experts_routing.py``'s passes, with the unpatched model's outputs and gradients; every
other case (another implementation, a registered replacement, expert parallelism, another
transformers source, a forward set on the instance) runs the class's own forward."""

from __future__ import annotations

import copy

import pytest
import torch
from test_experts_gate import _GPT_OSS, FAMILIES, _experts, _same_step

import xkernels
from helpers import tiny_model
from xkernels import experts_forward
from xkernels.ops.fused import experts_routing

#: families whose experts differ in what the routed forward passes through: Mixtral's plain experts,
#: Qwen3-MoE's eight of many, GPT-OSS's biases, transposed weights and clamped gate
ROUTED = {"mixtral": FAMILIES["mixtral"], "qwen3_moe": FAMILIES["qwen3_moe"], "gpt_oss": _GPT_OSS}


@pytest.fixture
def launches(monkeypatch) -> list[str]:
    """The routing passes launched, in order: ``combine``, ``combine grad``, ``gather grad``."""
    seen: list[str] = []
    real = experts_routing._plan

    def plan(*args):
        grad, weighted = args[8], args[5]
        seen.append("combine grad" if grad else "combine" if weighted else "gather grad")
        return real(*args)

    monkeypatch.setattr(experts_routing, "_plan", plan)
    return seen


@pytest.mark.parametrize("family", list(ROUTED))
def test_routed_experts_train_with_the_models_gradients(backend, device, family, launches):
    model, inputs = tiny_model(*ROUTED[family], device)
    model.set_experts_implementation("grouped_mm")
    fused = copy.deepcopy(model)
    report = xkernels.patch(fused)
    routed = [b for b in report.blocks if b.fusion == "experts routing"]
    assert sorted(b.name for b in routed) == sorted(_experts(fused)) and all("grouped_mm" in b.note for b in routed)
    _same_step(model, fused, inputs)
    n = len(routed)
    assert launches == (["combine"] * n + ["combine grad", "gather grad"] * n if backend.runs_triton else [])
    del launches[:]
    with torch.no_grad():  # inference: the weighted sum only (the gather has no gradient to sum)
        torch.testing.assert_close(fused(**inputs).logits, model(**inputs).logits, rtol=1e-4, atol=1e-5)
    assert launches == (["combine"] * n if backend.runs_triton else [])


@pytest.mark.parametrize("implementation", ["batched_mm", "eager"])
def test_other_implementations_run_the_class_forward(backend, device, implementation, launches):
    """The implementation is read per call: changed after ``patch()``, the class's forward runs."""
    model, inputs = tiny_model(*FAMILIES["mixtral"], device)
    fused = copy.deepcopy(model)
    xkernels.patch(fused)
    for m in (model, fused):
        m.set_experts_implementation(implementation)
    _same_step(model, fused, inputs)
    assert launches == []


def test_a_registered_grouped_mm_is_the_one_run(backend, device, launches, monkeypatch):
    """A ``grouped_mm`` registered in the class's experts interface after ``patch()`` runs, not ours."""
    from transformers.integrations import moe

    model, inputs = tiny_model(*FAMILIES["mixtral"], device)
    model.set_experts_implementation("grouped_mm")
    xkernels.patch(model)
    calls = []

    def mine(self, *args):
        calls.append(type(self).__name__)
        return moe.grouped_mm_experts_forward(self, *args)

    monkeypatch.setitem(moe.ALL_EXPERTS_FUNCTIONS._local_mapping, "grouped_mm", mine)
    model(**inputs)
    assert calls == ["MixtralExperts"] and launches == []


def test_expert_parallelism_runs_the_class_forward(backend, device, launches):
    model, inputs = tiny_model(*FAMILIES["mixtral"], device)
    model.set_experts_implementation("grouped_mm")
    fused = copy.deepcopy(model)
    xkernels.patch(fused)
    for m in (model, fused):
        for name in _experts(m):
            m.get_submodule(name)._is_expert_parallel = True  # no sentinel rows here: the same results
    _same_step(model, fused, inputs)
    assert launches == []


def test_another_transformers_source_is_not_replaced(device, monkeypatch):
    """Where transformers' ``grouped_mm`` forward is not the one this module knows, the experts keep
    their forward (the gate is still fused)."""
    monkeypatch.setattr(experts_forward, "GROUPED_MM_EXPERTS_FORWARD",
                        experts_forward.GROUPED_MM_EXPERTS_FORWARD.replace(".sum(dim=1)", ".mean(dim=1)"))
    experts_forward._known_grouped_forward.cache_clear()
    try:
        model, _ = tiny_model(*FAMILIES["mixtral"], device)
        report = xkernels.patch(model)
        assert [b.fusion for b in report.blocks if "experts" in b.fusion] == ["experts gate"], str(report)
        assert "forward" not in model.get_submodule(_experts(model)[0]).__dict__
    finally:
        experts_forward._known_grouped_forward.cache_clear()


def test_a_forward_set_on_the_instance_is_kept(device):
    """A forward already on the instance (an offloading hook's, say) is not replaced; the gate is."""
    model, inputs = tiny_model(*FAMILIES["mixtral"], device)
    experts = model.get_submodule(_experts(model)[0])
    own = experts.forward
    experts.forward = own
    report = xkernels.patch(model)
    assert [b.fusion for b in report.blocks if "experts" in b.fusion] == ["experts gate"], str(report)
    assert experts.__dict__["forward"] is own and "_apply_gate" in experts.__dict__


def test_undo_and_copies(device):
    """``undo()`` removes the routed forward; a deep copy's is bound to the copy."""
    model, _ = tiny_model(*FAMILIES["mixtral"], device)
    report = xkernels.patch(model)
    copied = copy.deepcopy(model)
    for m in (model, copied):
        experts = m.get_submodule(_experts(m)[0])
        assert experts.forward.__func__ is experts_forward.routed_forward and experts.forward.__self__ is experts
    report.undo()
    experts = model.get_submodule(_experts(model)[0])
    assert "forward" not in experts.__dict__ and "_apply_gate" not in experts.__dict__


def test_the_arguments_by_name_or_otherwise(backend, device, launches):
    """The experts called with their arguments by name take the routed forward too; any other
    arguments go to the class's forward (which says what is wrong with them)."""
    model, inputs = tiny_model(*FAMILIES["mixtral"], device)
    model.set_experts_implementation("grouped_mm")
    experts = model.get_submodule(_experts(model)[0])
    xkernels.patch(model)
    h = torch.randn(5, 32, device=device)
    idx, w = torch.randint(0, 4, (5, 2), device=device), torch.rand(5, 2, device=device)
    want = type(experts).forward(experts, h, idx, w)
    for args, kwargs in (((h, idx, w), {}), ((h,), dict(top_k_weights=w, top_k_index=idx)),
                         ((), dict(hidden_states=h, top_k_index=idx, top_k_weights=w))):
        del launches[:]
        with torch.no_grad():
            torch.testing.assert_close(experts(*args, **kwargs), want.detach(), rtol=1e-5, atol=1e-6)
        assert launches == (["combine"] if backend.runs_triton else [])
    with pytest.raises(TypeError):
        experts(h, idx, routing_weights=w)
    del launches[:]
    # not (tokens, top_k) each: the class's forward gets them (on the CPU its gather or its view raises;
    # on cuda an out-of-range gather is a device-side assert that ends the process's CUDA context, so
    # the class's forward is replaced by one that records the call)
    seen = []

    def class_forward(module, hidden_states, top_k_index, top_k_weights):
        seen.append((hidden_states, top_k_index, top_k_weights))
        raise IndexError("the class's forward")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(experts), "forward", class_forward)
        for bad_idx, bad_w in ((idx[:, 0], w[:, 0]), (idx[:3], w[:3]), (idx, w[:, :1])):
            with pytest.raises(IndexError, match="the class's forward"), torch.no_grad():
                experts(h, bad_idx, bad_w)
            assert seen.pop()[1] is bad_idx
    assert launches == []
    if device.type == "cpu":
        for bad_idx, bad_w in ((idx[:, 0], w[:, 0]), (idx[:3], w[:3]), (idx, w[:, :1])):
            with pytest.raises((RuntimeError, IndexError)), torch.no_grad():
                experts(h, bad_idx, bad_w)  # as transformers' forward: its gather or its view fails

