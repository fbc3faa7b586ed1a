"""``patch()`` on mixture-of-experts models: the experts' ``_apply_gate`` (transformers'
``@use_experts_implementation`` default) becomes one pass each way (``xkernels/blocks.py``'s
``experts gate``, ``ops/fused/gated_activation.py``) under the grouped and batched experts
implementations, with the unpatched model's outputs and gradients; GPT-OSS's clamped gate
(interleaved halves) and its chunked copies likewise (``experts gate (clamped)``); a gate of
another form is kept."""

from __future__ import annotations

import copy

import pytest
import torch

import xkernels
from helpers import tiny_model
from xkernels.ops.fused import gated_activation

_COMMON = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
#: family -> (config, model, arguments); every one's experts are a ``@use_experts_implementation`` class
FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(_COMMON, intermediate_size=48, num_local_experts=4,
                                                            num_experts_per_tok=2)),
    "qwen2_moe (and its shared gated MLP)": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                                             dict(_COMMON, intermediate_size=48, moe_intermediate_size=24,
                                                  shared_expert_intermediate_size=40, num_experts=4,
                                                  num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_COMMON, intermediate_size=48, moe_intermediate_size=24,
                                                                num_experts=4, num_experts_per_tok=2, head_dim=8)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(_COMMON, intermediate_size=48, num_experts=4,
                                                      num_experts_per_tok=2)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(_COMMON, num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=24,
                         n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=0,
                         q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)),
}


def _experts(model: torch.nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if type(m).__name__.endswith("Experts")]


def _step(model: torch.nn.Module, inputs: dict) -> tuple[torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    y = model(**inputs).logits
    y.square().mean().backward()
    return y.detach(), [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]


def _patched_copy(model: torch.nn.Module, fusion: str, monkeypatch) -> tuple[torch.nn.Module, list, list]:
    """A patched copy of ``model`` whose every experts module took ``fusion`` (no note), its fused
    blocks, and the list each gate pass's glu form (``None``: act(gate) * up) is appended to."""
    fused = copy.deepcopy(model)
    report = xkernels.patch(fused)
    gates = [b for b in report.blocks if b.fusion == fusion]
    assert sorted(b.name for b in gates) == sorted(_experts(fused)) and not any(b.note for b in gates), str(report)
    launched: list = []
    real = gated_activation._forward
    monkeypatch.setattr(gated_activation, "_forward", lambda *a: launched.append(a[4]) or real(*a))
    return fused, gates, launched


def _same_step(model: torch.nn.Module, fused: torch.nn.Module, inputs: dict) -> None:
    """One training step of each: the outputs and every gradient equal."""
    want, want_grads = _step(model, inputs)
    got, got_grads = _step(fused, inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert [n for n, _ in got_grads] == [n for n, _ in want_grads]
    for (name, g), (_, w) in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_experts_train_through_the_fused_gate(backend, device, family, implementation, monkeypatch):
    model, inputs = tiny_model(*FAMILIES[family], device)
    model.set_experts_implementation(implementation)
    fused, gates, launched = _patched_copy(model, "experts gate", monkeypatch)
    _same_step(model, fused, inputs)
    # one pass per experts module where the backend runs kernels; the cpu backend runs the class's own gate
    assert launched == ([None] * len(gates) if backend.runs_triton else [])
    with torch.no_grad():
        torch.testing.assert_close(fused(**inputs).logits, model(**inputs).logits, rtol=1e-4, atol=1e-5)


def test_eager_experts_loop_is_reported(device):
    """The eager loop computes the gate inline: the fusion is made (the implementation can change
    later) and the report says when it runs."""
    model, inputs = tiny_model(*FAMILIES["mixtral"], device)
    model.set_experts_implementation("eager")
    want = model(**inputs).logits
    report = xkernels.patch(model)
    (gate,) = [b for b in report.blocks if b.fusion == "experts gate"]
    assert "'eager'" in gate.note and "grouped_mm" in gate.note
    torch.testing.assert_close(model(**inputs).logits, want, rtol=1e-4, atol=1e-5)


def test_unknown_activations_are_kept(device):
    """An activation gated_linear does not take leaves the experts unfused, with the reason."""
    model, inputs = tiny_model(*FAMILIES["mixtral"], device)
    (name,) = _experts(model)
    model.get_submodule(name).act_fn = torch.nn.Softplus()
    want = model(**inputs).logits
    report = xkernels.patch(model)
    assert [(m.name, m.reason) for m in report.left if "experts" in m.reason] == [
        (name, "experts gate not fused: act_fn (Softplus) is not an activation xkernels.ops.gated_linear takes")]
    torch.testing.assert_close(model(**inputs).logits, want)


def test_undo_gives_the_class_gate_back(device):
    model, _ = tiny_model(*FAMILIES["mixtral"], device)
    report = xkernels.patch(model)
    experts = model.get_submodule(_experts(model)[0])
    assert "_apply_gate" in experts.__dict__ and experts._xkernels_block.activation == "silu"
    report.undo()
    assert "_apply_gate" not in experts.__dict__ and "_xkernels_block" not in experts.__dict__


# -- clamped gates (GPT-OSS's) --------------------------------------------------------------------------------
_GPT_OSS = ("GptOssConfig", "GptOssForCausalLM", dict(_COMMON, intermediate_size=48, num_local_experts=4,
                                                      num_experts_per_tok=2, head_dim=8))


def _tighten(model: torch.nn.Module, limit: float) -> None:
    """A limit inside a tiny model's gate_up values, so that the clamps bound."""
    for name in _experts(model):
        model.get_submodule(name).limit = limit


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm", "eager"])
def test_gpt_oss_experts_train_through_the_clamped_gate(backend, device, implementation, monkeypatch):
    """GPT-OSS's interleaved, clamped gate as one pass each way under every experts
    implementation (its eager loop calls ``_apply_gate`` too, so no note): outputs and every
    gradient equal the unpatched model's; the limit is read at each call."""
    model, inputs = tiny_model(*_GPT_OSS, device)
    model.set_experts_implementation(implementation)
    fused, gates, launched = _patched_copy(model, "experts gate (clamped)", monkeypatch)
    for limit in (0.05, 0.02):
        _tighten(model, limit)
        _tighten(fused, limit)
        del launched[:]
        _same_step(model, fused, inputs)
        if backend.runs_triton:  # a pass per experts module (per expert hit in the eager loop), with this limit
            assert len(launched) >= len(gates) and {glu.limit for glu in launched} == {limit}, launched
        else:
            assert not launched


def _experts_module(module: str, cls: str, config: str, **kwargs) -> torch.nn.Module:
    tf = pytest.importorskip("transformers")
    mod = pytest.importorskip(f"transformers.models.{module}.modeling_{module}")
    if not hasattr(mod, cls):
        pytest.skip(f"transformers {tf.__version__} has no {cls}")
    return getattr(mod, cls)(getattr(tf, config)(**kwargs))


#: the other classes with a clamped gate: their experts module alone (module, class, config, its arguments)
CLAMPED_CLASSES = {
    "openai_privacy_filter (chunked halves)": ("openai_privacy_filter", "OpenAIPrivacyFilterExperts",
                                               "OpenAIPrivacyFilterConfig",
                                               dict(hidden_size=16, intermediate_size=12, num_local_experts=2)),
    "minimax_m3_vl (swiglu_limit, swiglu_alpha)": ("minimax_m3_vl", "MiniMaxM3VLExperts", "MiniMaxM3VLTextConfig",
                                                   dict(hidden_size=16, intermediate_size=12, num_local_experts=2)),
    "deepseek_v4 (SiLU of the clamped gate)": ("deepseek_v4", "DeepseekV4Experts", "DeepseekV4Config",
                                               dict(hidden_size=16, moe_intermediate_size=12, n_routed_experts=2)),
    "glm5_next (F.silu, swiglu_limit)": ("glm5_next", "Glm5NextTextExperts", "Glm5NextTextConfig",
                                         dict(hidden_size=16, moe_intermediate_size=12, num_local_experts=2,
                                              swiglu_limit=0.5)),
    "hy_v4 (F.silu, swiglu_limit)": ("hy_v4", "HYV4Experts", "HYV4Config",
                                     dict(hidden_size=16, moe_intermediate_size=12, num_local_experts=2,
                                          swiglu_limit=0.5)),
}


@pytest.mark.parametrize("family", list(CLAMPED_CLASSES))
def test_other_clamped_gates_are_the_classes_own(backend, device, family):
    """Each class's ``_apply_gate`` patched equals its own on values across the clamps, forward
    and gradient; the numbers are the module's attributes."""
    experts = _experts_module(*CLAMPED_CLASSES[family][:3], **CLAMPED_CLASSES[family][3]).to(device)
    report = xkernels.patch(experts)
    assert [b.fusion for b in report.blocks] == ["experts gate (clamped)", "experts routing"], str(report)
    limit = next(getattr(experts, a) for a in ("limit", "swiglu_limit") if hasattr(experts, a))
    gu = (torch.randn(6, 24, device=device) * limit).requires_grad_()
    ref = gu.detach().clone().requires_grad_()
    got = experts._apply_gate(gu)
    want = type(experts)._apply_gate(experts, ref)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    dy = torch.randn_like(want)
    got.backward(dy)
    want.backward(dy)
    torch.testing.assert_close(gu.grad, ref.grad, rtol=1e-5, atol=1e-6)
    assert (ref.grad == 0).any(), "the clamps never bound"


def test_a_gate_of_its_own_is_kept(device):
    """An experts class whose ``_apply_gate`` is none of the known forms keeps it (not a candidate)."""
    model, inputs = tiny_model(*_GPT_OSS, device)
    (name,) = _experts(model)
    experts = model.get_submodule(name)

    class OwnGate(type(experts)):
        def _apply_gate(self, gate_up):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            return torch.tanh(gate) * up

    experts.__class__ = OwnGate
    want = model(**inputs).logits
    report = xkernels.patch(model)
    assert not any("experts gate" in b.fusion for b in report.blocks), str(report)
    torch.testing.assert_close(model(**inputs).logits, want)


def test_an_fp32_gate_is_the_pass(backend, device):
    """Beam's experts compute ``act_fn(gate) * up`` in fp32 and round once: the pass does that in
    every dtype, so it takes their gate too (``experts gate``); on bf16 values the result is the
    class's own within one rounding."""
    experts = _experts_module("beam", "BeamExperts", "BeamConfig", hidden_size=16, moe_intermediate_size=12,
                              num_experts=2).to(device)
    report = xkernels.patch(experts)
    assert [b.fusion for b in report.blocks] == ["experts gate", "experts routing"], str(report)
    gu = torch.randn(6, 24, device=device).to(torch.bfloat16)
    torch.testing.assert_close(experts._apply_gate(gu), type(experts)._apply_gate(experts, gu), rtol=8e-3, atol=1e-5)


def test_an_activation_swapped_after_patch_is_the_one_used(backend, device, monkeypatch):
    """The gate pass was set up for the act_fn patch() saw: another activation module put there
    later makes the class's own gate run (with it), never the pass with the old activation."""
    model, inputs = tiny_model(*FAMILIES["mixtral"], device)
    fused, gates, launched = _patched_copy(model, "experts gate", monkeypatch)
    for m in (model, fused):
        m.get_submodule(_experts(m)[0]).act_fn = torch.nn.GELU()
    _same_step(model, fused, inputs)
    assert not launched
