"""``patch()`` on model families beyond the ones its block forwards were written from: each tiny
model (random init, dropout 0, eager attention, 2 layers) trains one step patched, and its output
and every parameter's gradient match the unpatched model's float64 run as closely as PyTorch's
own float32 run does (``assert_model_close``). Whatever ``patch()`` recognises is fused, the rest
keeps its own forward; either way nothing may change but the speed.

Families: decoder LMs (Qwen3 with q/k norms, Gemma2/3/4 with sandwich norms, Helium, Flint, Nemotron,
Persimmon and Arcee with the squared ReLU,
NanoChat and HRM with weightless RMSNorms, RecurrentGemma, Granite's scaled residuals, Cohere's parallel block, Falcon,
GPT-NeoX, GPT-J, CodeGen, GPT-Neo, Bloom, OPT, Phi, StableLM,
Starcoder2, OLMo 1/2, Exaone4, Ernie 4.5, Apertus, GPT-BigCode; Mixtral, Qwen2-MoE, Llama 4 and GPT-OSS experts),
encoders (RoBERTa, Electra, DistilBERT, ModernBERT), vision (DeiT, DINOv2, DINOv3, BEiT, CLIP with its
QuickGELU, SigLIP, Swin, ConvNeXt) and encoder-decoders (T5 with gated-gelu and with ReLU, BART).

Every causal LM among them, and the families ``patch()``'s block forwards were written from
(Llama, Mistral, Qwen2, Gemma, Phi-3, GPT-2), also generates: ``model.generate()`` with the KV
cache (one token per step after the prompt), patched, gives the original's tokens and step logits."""

from __future__ import annotations

import copy

import pytest
import torch

import xkernels
from helpers import assert_model_close, require_transformers

H = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
LM = dict(H, num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
VISION = dict(H, image_size=32, patch_size=8)

#: family -> (config class, model class, config arguments); inputs: token ids, or pixels for vision
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", LM),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(LM, head_dim=8)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(LM, head_dim=8)),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(LM, head_dim=8)),
    "helium": ("HeliumConfig", "HeliumForCausalLM", dict(LM, head_dim=8)),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", dict(LM, partial_rotary_factor=0.5)),
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM", dict(H, vocab_size=64)),
    "arcee": ("ArceeConfig", "ArceeForCausalLM", LM),
    "flint": ("FlintConfig", "FlintForCausalLM", LM),
    "nanochat": ("NanoChatConfig", "NanoChatForCausalLM", LM),
    "hrm_text": ("HrmTextConfig", "HrmTextForCausalLM", dict(LM, num_hidden_layers=1, H_cycles=1, L_cycles=1)),
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", dict(LM, intermediate_size_mlp=48, num_local_experts=4,
                                                             num_experts_per_tok=1, head_dim=8,
                                                             interleave_moe_layer_step=2)),
    "recurrent_gemma": ("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", dict(
        LM, lru_width=32, attention_window_size=16, block_types=["recurrent", "attention"], head_dim=8)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(LM, num_local_experts=4, num_experts_per_tok=2, head_dim=8)),
    "granite": ("GraniteConfig", "GraniteForCausalLM", LM),
    "cohere": ("CohereConfig", "CohereForCausalLM", LM),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(LM, new_decoder_architecture=False)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", LM),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, vocab_size=64)),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM", dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                                             vocab_size=64)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_layer=2, n_head=4, vocab_size=64)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(LM, ffn_dim=48, word_embed_proj_dim=32)),
    "phi": ("PhiConfig", "PhiForCausalLM", LM),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", LM),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", LM),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", LM),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", LM),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", LM),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", LM),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(hidden_size=32, num_layers=2, num_heads=4, vocab_size=64,
                                                          intermediate_size=48, max_position_embeddings=64,
                                                          attention_types=[[["global", "local"], 1]])),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(n_embd=32, n_layer=2, n_head=4, vocab_size=64)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(LM, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(LM, moe_intermediate_size=24, num_experts=4,
                                                                shared_expert_intermediate_size=24,
                                                                num_experts_per_tok=2)),
    "roberta": ("RobertaConfig", "RobertaModel", dict(H, vocab_size=64, max_position_embeddings=64)),
    "electra": ("ElectraConfig", "ElectraModel", dict(H, embedding_size=32, vocab_size=64,
                                                      max_position_embeddings=64)),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=48,
                                                               vocab_size=64, max_position_embeddings=64)),
    "modernbert": ("ModernBertConfig", "ModernBertModel", dict(H, vocab_size=64, pad_token_id=0, bos_token_id=1,
                                                               eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    "deit": ("DeiTConfig", "DeiTModel", VISION),
    "dinov2": ("Dinov2Config", "Dinov2Model", dict(VISION, mlp_ratio=2)),
    "beit": ("BeitConfig", "BeitModel", VISION),
    "dinov3": ("DINOv3ViTConfig", "DINOv3ViTModel", dict(VISION, num_register_tokens=2)),
    "clip_vision": ("CLIPVisionConfig", "CLIPVisionModel", VISION),
    "siglip_vision": ("SiglipVisionConfig", "SiglipVisionModel", VISION),
    "swin": ("SwinConfig", "SwinModel", dict(embed_dim=16, depths=[1, 1], num_heads=[2, 2], image_size=32,
                                             patch_size=4, window_size=4)),
    "convnext": ("ConvNextConfig", "ConvNextModel", dict(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                                                         image_size=32, patch_size=4)),
    "t5": ("T5Config", "T5Model", dict(d_model=32, d_ff=48, num_layers=2, num_heads=4, d_kv=8, vocab_size=64,
                                       feed_forward_proj="gated-gelu")),
    "t5_relu": ("T5Config", "T5Model", dict(d_model=32, d_ff=48, num_layers=2, num_heads=4, d_kv=8, vocab_size=64,
                                            feed_forward_proj="relu")),
    "bart": ("BartConfig", "BartModel", dict(d_model=32, encoder_ffn_dim=48, decoder_ffn_dim=48, encoder_layers=2,
                                             decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                                             vocab_size=64, max_position_embeddings=64)),
}


#: the block forwards' own families, for generation (the training test covers them in test_patch.py)
GENERATORS: dict[str, tuple[str, str, dict]] = {
    **{f: v for f, v in FAMILIES.items() if v[1].endswith("ForCausalLM")},
    "llama": ("LlamaConfig", "LlamaForCausalLM", LM),
    "mistral": ("MistralConfig", "MistralForCausalLM", LM),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", LM),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(LM, head_dim=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(LM, pad_token_id=0)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64)),
}


def _build(tf, family: str, families: dict[str, tuple[str, str, dict]] = FAMILIES) -> torch.nn.Module:
    cfg_name, model_name, kwargs = families[family]
    if not hasattr(tf, cfg_name) or not hasattr(tf, model_name):
        pytest.skip(f"transformers {tf.__version__} has no {model_name}")
    cfg = getattr(tf, cfg_name)(**kwargs)
    for attr, value in list(vars(cfg).items()):  # dropout off: the runs must be deterministic
        if isinstance(value, float) and ("dropout" in attr or attr.endswith("_pdrop") or attr == "drop_path_rate"):
            setattr(cfg, attr, 0.0)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "_experts_implementation"):
        cfg._experts_implementation = "eager"  # grouped_mm has no float64 for the reference
    torch.manual_seed(0)
    return getattr(tf, model_name)(cfg)


def _inputs(family: str, device: torch.device) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    if FAMILIES[family][2] is VISION or family in ("dinov2", "dinov3", "swin", "convnext"):
        return {"pixel_values": torch.randn(2, 3, 32, 32, device=device)}
    ids = {"input_ids": torch.randint(3, 64, (2, 7), device=device)}
    if family in ("t5", "t5_relu", "bart"):
        ids["decoder_input_ids"] = torch.randint(3, 64, (2, 5), device=device)
    return ids


def _step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]):
    """The output (logits or last hidden state) and every parameter's gradient of its mean square."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    y = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    y.double().square().mean().backward()
    return y.detach(), [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patch_keeps_every_family_exact(backend, device, family):
    tf = require_transformers()
    model = _build(tf, family).to(device).train()
    ref64 = copy.deepcopy(model).double()
    inputs = _inputs(family, device)
    want, want_grads = _step(model, inputs)
    ref, ref_grads = _step(ref64, {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})
    report = xkernels.patch(model)
    assert report.replaced, f"{family}: no nn.Linear replaced\n{report}"
    got, got_grads = _step(model, inputs)
    assert_model_close(got, want, ref)
    assert [n for n, _ in got_grads] == [n for n, _ in want_grads], "a parameter lost (or gained) its gradient"
    for (name, g), (_, w), (_, r) in zip(got_grads, want_grads, ref_grads):
        try:
            assert_model_close(g, w, r)
        except AssertionError as e:
            raise AssertionError(f"{family}: gradient of {name}: {e}") from None
    report.undo()
    again, _ = _step(model, inputs)
    assert_model_close(again, want, ref)


@pytest.mark.parametrize("family", list(GENERATORS))
def test_patched_generation_matches(backend, device, family):
    """Greedy ``generate()`` of a patched model (prompt, then one token per step through the KV
    cache: the decoder layers' fused forwards with ``past_key_values``) gives the original's
    tokens, and each step's logits within the float32 tolerance of the float64 model's."""
    tf = require_transformers()
    model = _build(tf, family, GENERATORS).to(device).eval()
    ref64 = copy.deepcopy(model).double()
    patched = copy.deepcopy(model)
    report = xkernels.patch(patched)
    assert report.replaced, f"{family}: no nn.Linear replaced\n{report}"
    torch.manual_seed(1)
    ids = torch.randint(3, 64, (2, 5), device=device)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None, use_cache=True,
              return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        want, got = model.generate(ids, **kw), patched.generate(ids, **kw)
        # the float64 model's logits at the same tokens (one full forward over the sequence)
        ref = ref64(want.sequences[:, :-1]).logits[:, ids.shape[1] - 1:]
    assert torch.equal(got.sequences, want.sequences), f"{family}: {got.sequences} != {want.sequences}"
    assert len(got.logits) == len(want.logits) == ref.shape[1] == 4
    for step, (g, w) in enumerate(zip(got.logits, want.logits)):
        r = ref[:, step]
        try:
            assert_model_close(g, w, r)
        except AssertionError as e:
            raise AssertionError(f"{family}: logits of step {step}: {e}") from None
