"""``xkernels.patch``'s block fusions (``xkernels/blocks.py``) on tiny configs of each model family
they recognise: outputs and gradients against the unpatched model and float64, the report, undo,
and the modules they must leave alone."""

from __future__ import annotations

import copy

import pytest
import torch

import xkernels
from helpers import assert_model_close, require_transformers
from xkernels import blocks

ATTN = {"attn_implementation": "eager"}


def _llama_like(tf, family: str):
    common = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, **ATTN)
    if family == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    if family == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**common))
    if family == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**common))
    if family == "gemma":
        return tf.GemmaForCausalLM(tf.GemmaConfig(head_dim=8, hidden_act="gelu_pytorch_tanh", **common))
    if family == "phi3":
        return tf.Phi3ForCausalLM(tf.Phi3Config(pad_token_id=0, **common))
    raise ValueError(family)


#: per family: the block fusions patch() makes in a 2-layer model (the RMSNorms: 2 per layer + the
#: final one; Phi-3's decoder layer adds dropout to its residuals, so it keeps its own forward)
DECODER = "residual add + norm (pre-norm decoder layer) + residual add in mlp.down_proj"
GPT2 = "residual add + norm (GPT-2 block) + residual add in mlp.c_proj (while dropout is inactive)"
EXPECTED = {
    "llama": {DECODER: 2, "gated mlp": 2, "rms norm": 5},
    "mistral": {DECODER: 2, "gated mlp": 2, "rms norm": 5},
    "qwen2": {DECODER: 2, "gated mlp": 2, "rms norm": 5},
    "gemma": {DECODER: 2, "gated mlp": 2, "rms norm": 5},
    "phi3": {"gated mlp (gate_up)": 2, "rms norm": 5},
}


def _counts(report) -> dict[str, int]:
    return {k: v for k, v in report.counts().items() if k not in ("linear", "linear + activation")}


def _run(model, ids, train: bool):
    """The model's logits (and every parameter's gradient of their sum, when ``train``)."""
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(train):
        out = model(ids).logits
    if not train:
        return out, []
    out.float().sum().backward()
    return out, [p.grad for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("family", list(EXPECTED))
def test_decoder_families(backend, device, family):
    tf = require_transformers()
    torch.manual_seed(0)
    model = _llama_like(tf, family).to(device)
    ref64 = copy.deepcopy(model).double()
    keys = list(model.state_dict())
    ids = torch.randint(0, 64, (2, 7), device=device)
    train = family in ("llama", "phi3")  # gradients through every fused op, on two families
    want, want_grads = _run(model, ids, train)
    ref, ref_grads = _run(ref64, ids, train)
    report = xkernels.patch(model)
    assert _counts(report) == EXPECTED[family], str(report)
    assert list(model.state_dict()) == keys
    got, got_grads = _run(model, ids, train)
    assert_model_close(got, want.detach(), ref.detach())
    for g, w, r in zip(got_grads, want_grads, ref_grads):
        assert_model_close(g, w, r)
    text = str(report)
    assert "fused model.layers.0.mlp (" in text
    report.undo()
    assert not any("forward" in m.__dict__ for m in model.modules())
    again, _ = _run(model, ids, False)
    assert_model_close(again, want.detach(), ref.detach())


def test_bert_output_blocks_and_training(backend, device):
    tf = require_transformers()
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, **ATTN)
    torch.manual_seed(0)
    model = tf.BertModel(cfg).to(device)
    ref64 = copy.deepcopy(model).double()
    ids = torch.randint(0, 64, (2, 6), device=device)

    def run(m):
        m.zero_grad(set_to_none=True)
        out = m(ids).last_hidden_state
        out.sum().backward()
        return out, [p.grad for p in m.parameters() if p.grad is not None]

    want, want_grads = run(model)
    ref, ref_grads = run(ref64)
    report = xkernels.patch(model)
    assert _counts(report) == {"residual add + norm (output block)": 4}
    assert {b.name for b in report.blocks} == {f"encoder.layer.{i}.{w}" for i in range(2)
                                               for w in ("attention.output", "output")}
    got, got_grads = run(model)
    assert_model_close(got, want.detach(), ref.detach())
    assert len(got_grads) == len(want_grads)
    for g, w, r in zip(got_grads, want_grads, ref_grads):
        assert_model_close(g, w, r)


def test_gpt2_and_vit_blocks(backend, device):
    tf = require_transformers()
    torch.manual_seed(0)
    gpt2 = tf.GPT2Model(tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ATTN)).to(device).eval()
    vit = tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                   image_size=16, patch_size=8, **ATTN), add_pooling_layer=False).to(device).eval()
    ids = torch.randint(0, 64, (2, 6), device=device)
    pixels = torch.randn(2, 3, 16, 16, device=device)
    for model, x, fusion in ((gpt2, ids, GPT2),
                             (vit, pixels, "residual add + norm (ViT layer)")):
        ref64 = copy.deepcopy(model).double()
        with torch.no_grad():
            want = model(x).last_hidden_state
            ref = ref64(x if x.dtype == torch.long else x.double()).last_hidden_state
            report = xkernels.patch(model)
            got = model(x).last_hidden_state
        assert _counts(report) == {fusion: 2}, str(report)
        assert_model_close(got, want, ref)


def test_detection_is_by_forward_not_by_name():
    """A class of any name with Llama's RMSNorm forward is fused; a copy whose forward differs in
    one statement is not; hooks keep a matching module unfused, with the reason."""
    class MyNorm(torch.nn.Module):  # Llama's RMSNorm under another name
        def __init__(self, n):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(n))
            self.variance_epsilon = 1e-6

        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)

    class ScaledNorm(MyNorm):  # one statement differs: a different computation
        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return 2 * self.weight * hidden_states.to(input_dtype)

    assert blocks.fusion_for(MyNorm(8))[0].name == "rms norm"
    assert blocks.fusion_for(ScaledNorm(8)) == (None, None)
    hooked = MyNorm(8)
    hooked.register_forward_hook(lambda *a: None)
    assert blocks.fusion_for(hooked)[1] == "the module has hooks"
    model = torch.nn.Sequential(MyNorm(8), ScaledNorm(8), hooked)
    x = torch.randn(3, 8)
    with torch.no_grad():
        want = model(x)
        report = xkernels.patch(model)
        got = model(x)
    assert [b.name for b in report.blocks] == ["0"]
    assert [(m.name, m.reason) for m in report.left] == [("2", "rms norm not fused: the module has hooks")]
    torch.testing.assert_close(got, want)


def test_patched_block_copies_compute_with_their_own_parameters():
    """The fused forward is bound to its module: a deep copy runs on the copy's parameters."""
    tf = require_transformers()
    model = _llama_like(tf, "llama").eval()
    xkernels.patch(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        a, b = model(ids).logits, twin(ids).logits
    assert not torch.allclose(a, b)
    assert twin.model.layers[0].forward.__self__ is twin.model.layers[0]


class _Spy:
    """Counts ``xkernels.blocks``' ``linear`` calls with a residual (and those writing into it)."""

    def __init__(self, monkeypatch):
        self.with_residual = self.in_place = 0
        real = blocks.linear

        def spy(*args, **kwargs):
            if kwargs.get("residual") is not None:
                self.with_residual += 1
                self.in_place += kwargs.get("out") is kwargs["residual"]
            return real(*args, **kwargs)

        monkeypatch.setattr(blocks, "linear", spy)


def test_decoder_layer_adds_the_residual_in_down_proj(backend, device, monkeypatch):
    """The pre-norm decoder layer's closing add runs in the down projection's epilogue (in place
    under no_grad, out of place while training, gradients as the unpatched model's); a hooked
    down_proj keeps the add after it, and the report says which layers fuse it."""
    tf = require_transformers()
    torch.manual_seed(0)
    model = _llama_like(tf, "llama").to(device)
    ref64 = copy.deepcopy(model).double()
    ids = torch.randint(0, 64, (2, 5), device=device)
    want, want_grads = _run(model, ids, True)
    ref, ref_grads = _run(ref64, ids, True)
    model.model.layers[1].mlp.down_proj.register_forward_hook(lambda *a: None)
    report = xkernels.patch(model)
    names = {b.name: b.fusion for b in report.blocks}
    assert names["model.layers.0"] == DECODER
    assert names["model.layers.1"] == "residual add + norm (pre-norm decoder layer)"
    spy = _Spy(monkeypatch)
    got, got_grads = _run(model, ids, True)
    assert (spy.with_residual, spy.in_place) == (1, 0)
    assert_model_close(got, want.detach(), ref.detach())
    for g, w, r in zip(got_grads, want_grads, ref_grads):
        assert_model_close(g, w, r)
    got, _ = _run(model, ids, False)
    assert (spy.with_residual, spy.in_place) == (2, 1)
    assert_model_close(got, want.detach(), ref.detach())


def test_gpt2_block_fuses_c_proj_only_while_dropout_is_inactive(backend, device, monkeypatch):
    """GPT-2's ``residual + dropout(c_proj(h))``: the residual goes into c_proj's epilogue in eval
    and with p = 0 (gradients as the unpatched model's); in training with p > 0 the add stays
    after the dropout (same dropout masks as the unpatched model for the same seed)."""
    tf = require_transformers()
    torch.manual_seed(0)
    cfg = dict(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, embd_pdrop=0.0, attn_pdrop=0.0, **ATTN)
    ids = torch.randint(0, 64, (2, 6), device=device)
    for p in (0.0, 0.1):
        model = tf.GPT2Model(tf.GPT2Config(resid_pdrop=p, **cfg)).to(device).train()
        twin = copy.deepcopy(model)
        ref64 = copy.deepcopy(model).double()

        def run(m, seed=1):
            torch.manual_seed(seed)
            m.zero_grad(set_to_none=True)
            out = m(ids).last_hidden_state
            out.float().sum().backward()
            return out.detach(), [q.grad for q in m.parameters() if q.grad is not None]

        want, want_grads = run(twin)
        ref, ref_grads = run(ref64)
        report = xkernels.patch(model)
        assert report.counts()[GPT2] == 2
        spy = _Spy(monkeypatch)
        got, got_grads = run(model)
        assert spy.with_residual == (2 if p == 0 else 0)
        assert_model_close(got, want, ref)
        for g, w, r in zip(got_grads, want_grads, ref_grads):
            assert_model_close(g, w, r)
        model.eval()
        with torch.no_grad():
            got = model(ids).last_hidden_state
            want = twin.eval()(ids).last_hidden_state
            ref = ref64.eval()(ids).last_hidden_state
        assert spy.with_residual == (4 if p == 0 else 2) and spy.in_place == 2
        assert_model_close(got, want, ref)
        monkeypatch.undo()
