"""``patch()``'s rotary embedding fusion (xkernels/rotary_fusion.py): attention modules whose
forward calls one of transformers' ``apply_rotary_pos_emb`` forms (halves or adjacent pairs) run
``xkernels.ops.rotary_embedding`` (the kernel, forward and backward); other instances and the
class keep the original; an unknown form is left and reported; ``undo()`` restores."""

from __future__ import annotations

import copy

import pytest
import torch

import xkernels
from helpers import assert_model_close, require_transformers
from xkernels import rotary_fusion
from xkernels.ops.fused import rotary

LM = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          vocab_size=64, max_position_embeddings=64)
#: family -> (config class, model class, config arguments)
ROTATE_HALF = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", LM),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", LM),
    "gpt_neox (partial)": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(LM, rotary_pct=0.5)),
    "phi3 (partial)": ("Phi3Config", "Phi3ForCausalLM", dict(LM, pad_token_id=0, partial_rotary_factor=0.5)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", LM),
    "nemotron (partial)": ("NemotronConfig", "NemotronForCausalLM", dict(LM, partial_rotary_factor=0.5)),
    "nanochat (negated rotation)": ("NanoChatConfig", "NanoChatForCausalLM", LM),
    "gpt_oss (half-width angles)": ("GptOssConfig", "GptOssForCausalLM", dict(LM, num_local_experts=4,
                                                                              num_experts_per_tok=2, head_dim=8)),
    "modernbert (fp32)": ("ModernBertConfig", "ModernBertForMaskedLM", dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, vocab_size=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, sep_token_id=2, cls_token_id=1)),
    # adjacent pairs (interleaved=True): cos / sin per column, or their first half repeated
    "cohere (pairs)": ("CohereConfig", "CohereForCausalLM", LM),
    "glm (pairs, partial, halved)": ("GlmConfig", "GlmForCausalLM", dict(LM, pad_token_id=0, head_dim=8)),
    "helium (pairs, halved)": ("HeliumConfig", "HeliumForCausalLM", dict(LM, head_dim=8)),
    "ernie4_5 (pairs, halved)": ("Ernie4_5Config", "Ernie4_5ForCausalLM", LM),
    # one tensor per call (k, then q), rotate_every_two, sin / cos one column per pair
    "gptj (per tensor, partial)": ("GPTJConfig", "GPTJForCausalLM", dict(n_embd=32, n_layer=2, n_head=4,
                                                                         rotary_dim=4, vocab_size=64)),
    "codegen (per tensor, partial)": ("CodeGenConfig", "CodeGenForCausalLM", dict(n_embd=32, n_layer=2, n_head=4,
                                                                                  rotary_dim=4, vocab_size=64)),
    # Llama's rotation of one tensor per call (q, then k), unsqueeze_dim=2
    "gemma4 (per tensor)": ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(LM, head_dim=8)),
    "gptj (per tensor, rotary = head dim)": ("GPTJConfig", "GPTJForCausalLM", dict(n_embd=32, n_layer=2, n_head=4,
                                                                                   rotary_dim=8, vocab_size=64)),
}


def _build(tf, spec):
    cfg_name, model_name, kwargs = spec
    cfg = getattr(tf, cfg_name)(**kwargs)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "_experts_implementation"):
        cfg._experts_implementation = "eager"  # grouped_mm has no float64 for the reference
    torch.manual_seed(0)
    return getattr(tf, model_name)(cfg)


@pytest.fixture
def launches(monkeypatch):
    """Counts the rotary kernel's launches (forward and backward plans)."""
    seen = {"forward": 0, "backward": 0}
    real = rotary.RotaryPlan.run

    def counted(self, call):
        seen["backward" if call.backward else "forward"] += 1
        return real(self, call)

    monkeypatch.setattr(rotary.RotaryPlan, "run", counted)
    return seen


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    y = model(ids).logits
    y.double().square().mean().backward()
    return y.detach(), [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]


@pytest.mark.parametrize("family", list(ROTATE_HALF))
def test_attention_runs_the_fused_rotary(backend, device, family, launches):
    tf = require_transformers()
    model = _build(tf, ROTATE_HALF[family]).to(device).train()
    other = copy.deepcopy(model)  # an unpatched instance of the same classes
    ref64 = copy.deepcopy(model).double()
    ids = torch.randint(3, 64, (2, 7), device=device)
    want, want_grads = _step(model, ids)
    ref, ref_grads = _step(ref64, ids)
    report = xkernels.patch(model)
    assert report.counts().get(rotary_fusion.FUSION) == 2, report
    got, got_grads = _step(model, ids)
    if backend.runs_triton:
        per_layer = 2 if "per tensor" in family else 1  # GPT-J's form: one call per tensor
        assert launches == {"forward": 2 * per_layer, "backward": 2 * per_layer}, launches
    assert_model_close(got, want, ref)
    assert [n for n, _ in got_grads] == [n for n, _ in want_grads]
    for (_, g), (_, w), (_, r) in zip(got_grads, want_grads, ref_grads):
        assert_model_close(g, w, r)
    before = dict(launches)
    _step(other, ids)
    assert launches == before, "an unpatched instance of the same class ran the fused rotary"
    attn = next(m for m in model.modules() if "forward" in m.__dict__ and rotary_fusion.fusion_for(m)[0])
    assert not hasattr(type(attn).forward.__globals__[rotary_fusion.NAME], "original"), \
        "the class's module globals were changed"
    report.undo()
    assert not any("forward" in m.__dict__ for m in model.modules())
    _step(model, ids)
    assert launches == before, "undo() left the fused rotary in place"


def _trains_as_the_original(backend, model, forward, inputs, launches, fused):
    """One training step of ``model`` patched against the unpatched model and its float64 copy:
    ``patch()`` made the ``fused`` counts, the rotary kernel launched once per layer each way
    (two layers), output and every gradient as the original's."""
    ref64 = copy.deepcopy(model).double()

    def step(m, x):
        m.zero_grad(set_to_none=True)
        y = forward(m, x)
        y.double().square().mean().backward()
        return y.detach(), [(n, p.grad) for n, p in m.named_parameters() if p.grad is not None and p.numel()]

    want, want_grads = step(model, inputs)
    ref, ref_grads = step(ref64, inputs.double())
    report = xkernels.patch(model)
    assert all(report.counts().get(kind) == n for kind, n in fused.items()), report
    got, got_grads = step(model, inputs)
    if backend.runs_triton:
        assert launches == {"forward": 2, "backward": 2}, launches
    assert_model_close(got, want, ref)
    assert [n for n, _ in got_grads] == [n for n, _ in want_grads]
    for (_, g), (_, w), (_, r) in zip(got_grads, want_grads, ref_grads):
        assert_model_close(g, w, r)


@pytest.mark.parametrize("registers", [0, 2])
def test_vision_patch_tokens_run_the_fused_rotary(backend, device, registers, launches):
    """DINOv3's form: the patch tokens after the cls (and register) tokens rotated by the op, the
    prefix joined back unrotated; output and gradients as the original's, one launch per layer
    each way."""
    tf = require_transformers()
    cfg = tf.DINOv3ViTConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                             image_size=32, patch_size=8, num_register_tokens=registers)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.DINOv3ViTModel(cfg).to(device).train()
    _trains_as_the_original(backend, model, lambda m, x: m(pixel_values=x).last_hidden_state,
                            torch.randn(2, 3, 32, 32, device=device), launches, {rotary_fusion.FUSION: 2})


def test_vision_towers_run_the_fused_rotary(backend, device, launches):
    """The VLM vision towers' ``apply_rotary_pos_emb_vision`` (Qwen2.5-VL's here; 25 families
    share it): (tokens, heads, d) q / k in fp32, one launch per layer each way; the towers' gated
    MLPs (their forward's argument named ``hidden_state``) fused too; output and gradients as the
    original's."""
    require_transformers()
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as vl

    cfg = vl.Qwen2_5_VLVisionConfig(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=32,
                                    patch_size=4, spatial_merge_size=2, temporal_patch_size=2, window_size=16,
                                    fullatt_block_indexes=[1])
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = vl.Qwen2_5_VisionTransformerPretrainedModel(cfg).to(device).train()
    grid = torch.tensor([[1, 4, 4], [1, 4, 4]], device=device)
    _trains_as_the_original(backend, model, lambda m, x: m(x, grid_thw=grid).last_hidden_state,
                            torch.randn(2 * 16, 3 * 2 * 4 * 4, device=device), launches,
                            {rotary_fusion.FUSION: 2, "gated mlp": 2})
    mlp = model.blocks[0].mlp  # a call naming its input runs the class's own forward
    h = torch.randn(5, 32, device=device)
    torch.testing.assert_close(mlp(hidden_state=h), type(mlp).forward(mlp, h))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_vision_form_computes_in_fp32_as_the_original(backend, device, dtype):
    """Low-precision q / k with fp32 cos / sin (as the vision towers make them): the fused form
    computes in fp32 and rounds once to q's and k's dtypes, as the original does."""
    require_transformers()
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as vl

    fused = rotary_fusion.fused_rotary(vl.apply_rotary_pos_emb_vision, rotary_fusion.Form(False, vision=True))
    torch.manual_seed(0)
    q, k = torch.randn(50, 4, 16, device=device, dtype=dtype), torch.randn(50, 2, 16, device=device, dtype=dtype)
    angles = torch.rand(50, 8, device=device) * 6.3
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    q0, k0 = q.clone(), k.clone()
    got, want = fused(q, k, cos, sin), vl.apply_rotary_pos_emb_vision(q, k, cos, sin)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    for g, w, x in zip(got, want, (q, k)):
        assert g.dtype == w.dtype == dtype and g.shape == x.shape
        # one rounding of the same fp32 value, give or take fp32's own rounding order: at most one ulp
        torch.testing.assert_close(g, w, rtol=torch.finfo(dtype).eps, atol=torch.finfo(dtype).eps)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # a form xkernels does not know (no rotate_half)
    return q * cos.unsqueeze(unsqueeze_dim), k * sin.unsqueeze(unsqueeze_dim)


class UnknownRotaryAttention(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)


def test_an_unknown_rotary_form_is_left_and_reported(backend, device):
    model = torch.nn.Sequential(UnknownRotaryAttention(), UnknownRotaryAttention())
    report = xkernels.patch(model)
    assert rotary_fusion.FUSION not in report.counts()
    left = [m for m in report.left if rotary_fusion.FUSION in m.reason]
    assert len(left) == 2 and "not a form xkernels fuses" in left[0].reason, report
    assert all("forward" not in m.__dict__ for m in model)


def test_other_dtypes_and_shapes_keep_the_original(device):
    """The fused apply_rotary_pos_emb hands a call the op would compute differently (dtypes mixed
    other than a half q, k with fp32 angles; a full-width form given a narrower cos: the
    original's error) to the original."""
    calls = []

    def original(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(1)
        return q, k

    full = rotary_fusion.fused_rotary(original, rotary_fusion.Form(partial=False))
    q = torch.randn(1, 2, 3, 8, device=device)
    cos = torch.randn(1, 3, 8, device=device)
    full(q.half(), q.half(), cos.bfloat16(), cos.bfloat16())
    full(q, q, cos[..., :4], cos[..., :4])
    assert len(calls) == 2
    partial = rotary_fusion.fused_rotary(original, rotary_fusion.Form(partial=True))
    partial(q, q, cos[None].expand(2, 1, 3, 8), cos[None].expand(2, 1, 3, 8))  # cos would grow q: the op refuses
    assert len(calls) == 3


def test_a_rebound_apply_rotary_pos_emb_is_read_again(backend, device, monkeypatch):
    """Another library rebinding the module's apply_rotary_pos_emb after a patch: a later patch()
    decides on the new function (left, reported), never replaces it by the op."""
    tf = require_transformers()
    from transformers.models.llama import modeling_llama

    model = _build(tf, ROTATE_HALF["llama"])
    assert xkernels.patch(copy.deepcopy(model)).counts().get(rotary_fusion.FUSION) == 2

    def other(q, k, cos, sin, unsqueeze_dim=1):
        return q, k

    monkeypatch.setattr(modeling_llama, rotary_fusion.NAME, other)
    report = xkernels.patch(model)
    assert rotary_fusion.FUSION not in report.counts()
    assert sum(rotary_fusion.FUSION in m.reason for m in report.left) == 2, report


def test_a_halved_form_reads_new_angles(backend, device):
    """A halved form (GLM, Helium, Ernie 4.5) keeps the last cos / sin's repeated halves for the
    next layers: the same tensors written in place, or new ones, are read again."""
    from transformers.models.helium import modeling_helium

    original = modeling_helium.apply_rotary_pos_emb
    fused = rotary_fusion.fused_rotary(original, rotary_fusion.Form(partial=False, halved=True, interleaved=True))
    q, k = torch.randn(2, 4, 5, 8, device=device), torch.randn(2, 2, 5, 8, device=device)
    cos, sin = torch.randn(2, 5, 8, device=device), torch.randn(2, 5, 8, device=device)
    for step in range(4):
        if step == 2:
            cos.mul_(0.5)  # in place: a new version
        if step == 3:
            cos, sin = torch.randn_like(cos), torch.randn_like(sin)
        got, want = fused(q, k, cos, sin), original(q, k, cos, sin)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    with torch.inference_mode():  # inference tensors have no version counter: nothing is kept
        cos, sin = torch.randn_like(cos), torch.randn_like(sin)
        for step in range(3):
            if step == 1:
                cos.mul_(0.5)
            got, want = fused(q, k, cos, sin), original(q, k, cos, sin)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)


def test_gpt_j_generates_under_inference_mode(backend, device):
    """GPT-J's per-tensor form (its sin / cos repeated per pair) in ``torch.inference_mode``, as
    serving runs ``generate()``: the patched model's tokens are the original's."""
    tf = require_transformers()
    model = _build(tf, ROTATE_HALF["gptj (per tensor, partial)"]).to(device).eval()
    twin = copy.deepcopy(model)
    assert xkernels.patch(model).counts().get(rotary_fusion.FUSION) == 2
    ids = torch.randint(3, 64, (1, 5), device=device)
    with torch.inference_mode():
        kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert torch.equal(model.generate(ids, **kw), twin.generate(ids, **kw))



def test_the_halves_kept_are_never_another_calls(monkeypatch):
    """Threads sharing a patched model (a server's workers, ``nn.DataParallel``'s replicas) call
    one ``_Halves`` with their own cos / sin. Another call may run between a call's check of the
    kept key and its use (a thread switch): here it runs from inside the check itself, made
    deterministic by a key element whose comparison makes it. The checked call still gets the
    pairs of its own cos / sin."""
    halves = rotary_fusion._Halves()
    (cos, sin), (cos2, sin2) = [(torch.randn(1, 5, 8), torch.randn(1, 5, 8)) for _ in range(2)]
    armed = []

    class Switch:  # the key's capture flag; comparing it runs the other call once armed
        def __eq__(self, other):
            if armed:
                armed.clear()
                halves(cos2, sin2)
            return True

        __hash__ = object.__hash__

    monkeypatch.setattr(rotary_fusion, "_capturing", lambda t: Switch())
    halves(cos, sin)
    armed.append(True)
    c, s = halves(cos, sin)
    assert not armed, "the other call did not run inside the check"
    assert torch.equal(c, cos[..., :4].repeat_interleave(2, -1)) and torch.equal(s, sin[..., :4].repeat_interleave(2, -1))
    c2, _ = halves(cos2, sin2)  # and the other call's pairs are kept as its own
    assert torch.equal(c2, cos2[..., :4].repeat_interleave(2, -1))


@pytest.mark.parametrize("family", ["llama", "olmo", "gpt_neox (partial)", "cohere (pairs)"])
def test_half_q_with_fp32_angles_computes_in_fp32_as_the_original(backend, device, family, launches):
    """Under autocast a model with fp32 parameters makes fp32 cos / sin for bf16 q and k: the
    fused form runs the op on q and k in fp32 (one launch), with the original's result dtypes
    (fp32 where its formula promotes, q's dtype where it casts back: OLMo, Cohere), values as the
    original's against float64, and the gradients reach q and k in bf16."""
    tf = require_transformers()
    model = _build(tf, ROTATE_HALF[family])
    attn = next(m for m in model.modules() if rotary_fusion.fusion_for(m)[0])
    original = type(attn).forward.__globals__[rotary_fusion.NAME]
    form, _ = rotary_fusion._class_form(type(attn))
    fused = rotary_fusion.fused_rotary(original, form)
    torch.manual_seed(2)
    heads, d = 4, 8
    rot = d // 2 if "partial" in family else d
    q = torch.randn(2, heads, 5, d, device=device).bfloat16().requires_grad_()
    k = torch.randn(2, heads // 2, 5, d, device=device).bfloat16().requires_grad_()
    angles = torch.rand(2, 5, rot, device=device) * 6
    cos, sin = angles.cos(), angles.sin()
    want = original(q, k, cos, sin)
    ref = original(q.detach().double(), k.detach().double(), cos.double(), sin.double())
    got = fused(q, k, cos, sin)
    if backend.runs_triton:
        assert launches["forward"] == 1, launches
    for g, w, r in zip(got, want, ref):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert_model_close(g, w, r)
    dy = [torch.randn_like(w) for w in want]
    wq, wk = torch.autograd.grad(want, (q, k), dy)
    gq, gk = torch.autograd.grad(got, (q, k), dy)
    for g, w in ((gq, wq), (gk, wk)):
        assert g.dtype == w.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), w.float(), rtol=1.6e-2, atol=1e-2)
