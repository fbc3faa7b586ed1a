"""``xkernels.patch``'s block fusions (``xkernels/blocks.py``) on tiny configs of each model family
they recognise: outputs and gradients against the unpatched model and float64, the report, undo,
and the modules they must leave alone."""

from __future__ import annotations

import copy

import pytest
import torch

import xkernels
from helpers import TMA_FORMS, assert_model_close, require_transformers
from xkernels import blocks, mask_decisions
from xkernels.block_steps import NormStep
from xkernels.ops.fused import add_norm_compiled, rotary
from xkernels.patching import ADD_NORM_SITES, PRE_NORM_SITES

MASKS = mask_decisions.FUSION

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
#: final one; Phi-3's decoder layer adds dropout to its residuals, so it is not Llama's layer: its
#: source's pre-norm site is rewritten instead, ``xkernels/add_norm_forms.py``)
EXPECTED = {
    "llama": {"residual add + norm (pre-norm decoder layer)": 2, "gated mlp": 2, "rms norm": 5, "rotary embedding": 2},
    "mistral": {"residual add + norm (pre-norm decoder layer)": 2, "gated mlp": 2, "rms norm": 5,
                "rotary embedding": 2},
    "qwen2": {"residual add + norm (pre-norm decoder layer)": 2, "gated mlp": 2, "rms norm": 5, "rotary embedding": 2},
    "gemma": {"residual add + norm (pre-norm decoder layer)": 2, "gated mlp": 2, "rms norm": 5, "rotary embedding": 2},
    "phi3": {"residual add + norm (pre-norm)": 2, "gated mlp (gate_up)": 2, "rms norm": 5, "rotary embedding": 2},
}
for _counted in EXPECTED.values():
    _counted[MASKS] = 1  # the model-level module that creates the masks

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
    assert not [b.note for b in report.blocks
                if b.note and b.fusion != MASKS and b.note != f"{ADD_NORM_SITES}; {PRE_NORM_SITES}"], \
        "RMSNorm blocks always train fused"
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


def _tiny_bert(device, layers: int):
    """A tiny BertModel (no dropout), its float64 copy, token ids, and a training step of a model:
    (last hidden state, every gradient)."""
    tf = require_transformers()
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
                        vocab_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, **ATTN)
    torch.manual_seed(0)
    model = tf.BertModel(cfg).to(device)
    ids = torch.randint(0, 64, (2, 6), device=device)

    def run(m):
        m.zero_grad(set_to_none=True)
        out = m(ids).last_hidden_state
        out.sum().backward()
        return out, [p.grad for p in m.parameters() if p.grad is not None]

    return model, copy.deepcopy(model).double(), ids, run


def test_bert_output_blocks_and_training(backend, device):
    model, ref64, ids, run = _tiny_bert(device, 2)
    want, want_grads = run(model)
    ref, ref_grads = run(ref64)
    report = xkernels.patch(model)
    assert _counts(report) == {"residual add + norm (output block)": 4, "feed-forward (training)": 2,
                               "residual add + norm (post-norm)": 1,  # the embeddings' last add and LayerNorm
                               "attention mask by rows": 2,  # the self-attention's config proxy
                               MASKS: 1}  # BertModel's mask creation
    assert {b.name for b in report.blocks} == {f"encoder.layer.{i}{w}" for i in range(2)
                                               for w in (".attention.output", ".output", "", ".attention.self")
                                               } | {"embeddings", "(root)"}
    got, got_grads = run(model)
    assert_model_close(got, want.detach(), ref.detach())
    assert len(got_grads) == len(want_grads)
    for g, w, r in zip(got_grads, want_grads, ref_grads):
        assert_model_close(g, w, r)


@pytest.mark.parametrize("pays,captured", [(False, False), (True, False), (False, True)],
                         ids=["does not pay", "pays", "does not pay, graph captured"])
def test_layer_norm_blocks_train_through_pytorch_where_fusion_does_not_pay(backend, device, monkeypatch, pays,
                                                                           captured):
    """In eager training a LayerNorm block takes the fused op only where the bytes it saves
    outweigh its host cost (``Backend.fused_norm_training_host_ms``, or ``native_norm_training_host_ms``
    where the native extension records the call; measured on cuda); else
    PyTorch's add and LayerNorm. Inference keeps the fused op, and so does a CUDA-graph capture
    (``_capturing``, faked here: replays cost no host time). On a backend that runs no kernels
    (cpu) no call takes it. Outputs and gradients match the unpatched model either way."""

    model, ref64, ids, run = _tiny_bert(device, 1)
    for premium in ("fused_norm_training_host_ms", "native_norm_training_host_ms"):  # Python or native autograd
        monkeypatch.setattr(type(backend), premium, 0.0 if pays else 1.0)
    monkeypatch.setattr(xkernels.block_steps, "_capturing", lambda t: captured)
    from xkernels.ops.route import RouteCache

    fused = []  # every way a block reaches the fused op: the op itself, its routes with and without grad
    op = xkernels.ops.add_layer_norm
    for cls, name in ((type(op), "__call__"), (RouteCache, "run"), (RouteCache, "recorded")):
        real = getattr(cls, name)

        def spy(self, *a, _real=real, **k):
            if self is op or getattr(self, "op", None) is op:
                fused.append(1)
            return _real(self, *a, **k)

        monkeypatch.setattr(cls, name, spy)

    want, want_grads = run(model)
    ref, ref_grads = run(ref64)
    report = xkernels.patch(model)
    norms = [b for b in report.blocks if b.fusion.startswith("residual add + norm")]
    assert norms and all("PyTorch's add + LayerNorm" in b.note for b in norms)
    assert "in eager training, PyTorch's add + LayerNorm" in str(report)  # the report says so
    for _ in range(2):  # the first call and a repeat (its route)
        fused.clear()
        got, got_grads = run(model)
        assert bool(fused) == (backend.runs_triton and (pays or captured)), fused
        assert_model_close(got, want.detach(), ref.detach())
        for g, w, r in zip(got_grads, want_grads, ref_grads):
            assert_model_close(g, w, r)
    fused.clear()
    with torch.no_grad():
        model(ids)
    assert bool(fused) == backend.runs_triton, "inference keeps the fused op where the backend runs kernels"


def test_training_fusion_pays_weighs_saved_bytes_against_host_time():
    """``training_fusion_pays``: saved bytes (5 passes) at the copy bandwidth, measured or else
    the datasheet's, against the backend's host premium; no premium: always; no bandwidth: never."""
    from xkernels.backend import Figure
    from xkernels.ops.fused.add_norm_plan import TRAINING_PASSES_SAVED, training_fusion_pays

    class Props:
        def __init__(self, bw=None, sheet=None):
            self.copy_bandwidth = None if bw is None else Figure(bw, "GB/s", "measured", "")
            self.datasheet = {} if sheet is None else {"hbm_bandwidth": Figure(sheet, "GB/s", "datasheet", "")}

    class Fake:
        def __init__(self, premium, props):
            self.fused_norm_training_host_ms, self._props = premium, props
            self.native_norm_training_host_ms = premium  # the premium whichever autograd records the call

        def properties(self, device):
            return self._props

    cpu = torch.device("cpu")
    bert = 8192 * 768  # BERT-base at 16 x 512: 63 MB saved, ~21 us at 3 TB/s
    assert not training_fusion_pays(Fake(0.205, Props(3000)), cpu, bert, 2)
    assert training_fusion_pays(Fake(0.0, Props()), cpu, bert, 2)
    edge = int(0.205 * 3000e6 / (2 * TRAINING_PASSES_SAVED)) + 1  # the size where the bytes take 0.205 ms
    assert training_fusion_pays(Fake(0.205, Props(3000)), cpu, edge, 2)
    assert not training_fusion_pays(Fake(0.205, Props(3000)), cpu, edge - 2, 2)
    assert training_fusion_pays(Fake(0.205, Props(sheet=3000)), cpu, edge, 2)  # the datasheet's figure
    assert not training_fusion_pays(Fake(0.205, Props()), cpu, 10 * edge, 2)  # no bandwidth known


def test_gpt2_and_vit_blocks(backend, device):
    tf = require_transformers()
    torch.manual_seed(0)
    gpt2 = tf.GPT2Model(tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ATTN)).to(device).eval()
    vit = tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                   image_size=16, patch_size=8, **ATTN), add_pooling_layer=False).to(device).eval()
    ids = torch.randint(0, 64, (2, 6), device=device)
    pixels = torch.randn(2, 3, 16, 16, device=device)
    for model, x, fusion, extra in ((gpt2, ids, "residual add + norm (GPT-2 block)", {MASKS: 1}),
                                    (vit, pixels, "residual add + norm (ViT layer)", {"feed-forward (training)": 2,
                                                                                      "attention mask by rows": 2,
                                                                                      MASKS: 1})):
        ref64 = copy.deepcopy(model).double()
        with torch.no_grad():
            want = model(x).last_hidden_state
            ref = ref64(x if x.dtype == torch.long else x.double()).last_hidden_state
            report = xkernels.patch(model)
            got = model(x).last_hidden_state
        assert _counts(report) == {fusion: 2, **extra}, str(report)
        assert_model_close(got, want, ref)


def test_feed_forward_blocks_train_as_one_block(tma_interpreter, monkeypatch):
    """BERT's feed-forward chunk and ViT's MLP in training (fp16, the interpreter with the TMA path
    on): each layer's up-projection, activation and down-projection run as one autograd block
    (counted), output and every gradient against the unpatched model and float64; without a
    gradient, and under an unfused activation, the modules' own forwards run."""
    from xkernels import tuning
    from xkernels.ops.matmul import feed_forward

    tf = require_transformers()
    blocks_run = []
    real = feed_forward.FeedForwardFunction.apply
    monkeypatch.setattr(feed_forward.FeedForwardFunction, "apply", lambda *a: blocks_run.append(1) or real(*a))
    torch.manual_seed(0)
    bert = tf.BertModel(tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=64, max_position_embeddings=32,
                                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **ATTN))
    vit = tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                   image_size=16, patch_size=8, **ATTN), add_pooling_layer=False)
    ids = torch.randint(0, 64, (2, 6))
    pixels = torch.randn(2, 3, 16, 16)
    for model, x in ((bert, ids), (vit, pixels)):
        model = model.half()
        ref64 = copy.deepcopy(model).double()

        def run(m, inputs):
            m.zero_grad(set_to_none=True)
            with tuning.force(TMA_FORMS[1]):
                out = m(inputs).last_hidden_state
                out.float().sum().backward()
            return out, [p.grad for p in m.parameters() if p.grad is not None]

        want, want_grads = run(model, x if x.dtype == torch.long else x.half())
        ref, ref_grads = run(ref64, x if x.dtype == torch.long else x.double())
        report = xkernels.patch(model)
        assert report.counts()["feed-forward (training)"] == 2, str(report)
        got, got_grads = run(model, x if x.dtype == torch.long else x.half())
        assert len(blocks_run) == 2, str(report)
        assert_model_close(got, want.detach(), ref.detach())
        assert len(got_grads) == len(want_grads)
        for g, w, r in zip(got_grads, want_grads, ref_grads):
            assert_model_close(g, w, r)
        with torch.no_grad(), tuning.force(TMA_FORMS[1]):
            model(x if x.dtype == torch.long else x.half())
        assert len(blocks_run) == 2  # inference: the modules' own forwards (the fused linear layers)
        blocks_run.clear()
        report.undo()
        assert not any(k in m.__dict__ for m in model.modules() for k in ("forward", "feed_forward_chunk"))


def test_any_linear_activation_linear_chain_is_a_feed_forward_block(tma_interpreter, monkeypatch):
    """Detection by the forward's shape, not by names: GPT-NeoX's MLP (``dense_h_to_4h``, ``act``,
    ``dense_4h_to_h``) and a made-up MLP with nested calls become feed-forward blocks, their up
    projection swapped with the activation fused even where no pattern names their class; a
    training step through them matches the unpatched model and float64."""
    tf = require_transformers()
    from xkernels import tuning
    from xkernels.ops.matmul import feed_forward

    blocks_run = []
    real = feed_forward.FeedForwardFunction.apply
    monkeypatch.setattr(feed_forward.FeedForwardFunction, "apply", lambda *a: blocks_run.append(1) or real(*a))

    class Nested(torch.nn.Module):  # a class of no known family
        def __init__(self):
            super().__init__()
            self.inp, self.gelu, self.out = torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)

        def forward(self, x):
            y = self.gelu(self.inp(x))
            return self.out(y)

    torch.manual_seed(0)
    neox = tf.GPTNeoXModel(tf.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=64, vocab_size=64, max_position_embeddings=32,
                                            hidden_dropout=0.0, attention_dropout=0.0, **ATTN))
    assert blocks.mlp_chain(Nested) == ("inp", "gelu", "out")
    for model, x, n in ((neox, torch.randint(0, 64, (2, 6)), 2),
                        (torch.nn.Sequential(Nested(), torch.nn.LayerNorm(32)), torch.randn(2, 6, 32), 1)):
        model = model.half()
        ref64 = copy.deepcopy(model).double()

        def run(m, inputs):
            m.zero_grad(set_to_none=True)
            with tuning.force(TMA_FORMS[0]):
                out = m(inputs)
                out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out
                out.float().sum().backward()
            return out, [p.grad for p in m.parameters() if p.grad is not None]

        want, want_grads = run(model, x if x.dtype == torch.long else x.half())
        ref, ref_grads = run(ref64, x if x.dtype == torch.long else x.double())
        report = xkernels.patch(model)
        assert report.counts().get("feed-forward (training)") == n and len(report.fused) == n, str(report)
        got, got_grads = run(model, x if x.dtype == torch.long else x.half())
        assert len(blocks_run) == n
        assert_model_close(got, want.detach(), ref.detach())
        for g, w, r in zip(got_grads, want_grads, ref_grads):
            assert_model_close(g, w, r)
        blocks_run.clear()


def test_a_trailing_dropout_follows_the_fused_block(tma_interpreter, monkeypatch):
    """GPT-J's / GPT-Neo's MLP shape, ``down(act(up(x)))`` then a dropout: one fused block whose
    output goes through the module's own dropout, in training with p = 0.5 the same mask as the
    unpatched module draws (the same generator state), gradients included; a fourth child that
    is not a dropout is not a feed-forward block."""
    from xkernels import tuning
    from xkernels.ops.matmul import feed_forward

    blocks_run = []
    real = feed_forward.FeedForwardFunction.apply
    monkeypatch.setattr(feed_forward.FeedForwardFunction, "apply", lambda *a: blocks_run.append(1) or real(*a))

    class DropMLP(torch.nn.Module):
        def __init__(self, last):
            super().__init__()
            self.fc_in, self.act, self.fc_out = torch.nn.Linear(32, 64), torch.nn.GELU("tanh"), torch.nn.Linear(64, 32)
            self.drop = last

        def forward(self, hidden_states):
            hidden_states = self.fc_in(hidden_states)
            hidden_states = self.act(hidden_states)
            hidden_states = self.fc_out(hidden_states)
            hidden_states = self.drop(hidden_states)
            return hidden_states

    assert blocks.mlp_chain(DropMLP) == ("fc_in", "act", "fc_out", "drop")
    torch.manual_seed(0)
    model = DropMLP(torch.nn.Dropout(0.5)).half().train()
    twin = copy.deepcopy(model)
    x = torch.randn(2, 6, 32).half()

    def run(m):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with tuning.force(TMA_FORMS[0]):
            out = m(x)
            out.float().sum().backward()
        return out, [p.grad for p in m.parameters()]

    want, want_grads = run(twin)
    report = xkernels.patch(model)
    assert report.counts().get("feed-forward (training)") == 1, str(report)
    got, got_grads = run(model)
    assert blocks_run == [1]
    assert torch.equal(got == 0, want == 0), "the dropout mask differs"
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=5e-2)
    other = DropMLP(torch.nn.LayerNorm(32))
    report = xkernels.patch(torch.nn.Sequential(other))
    assert "feed-forward (training)" not in report.counts() and "forward" not in other.__dict__, str(report)


@pytest.mark.parametrize("source,chain", [
    ("def forward(self, x):\n    x = self.a(x)\n    x = self.b(x)\n    return self.c(x)\n", ("a", "b", "c")),
    ("def forward(self, x):\n    return self.c(self.b(self.a(x)))\n", ("a", "b", "c")),
    ("def forward(self, x):\n    h = self.a(x)\n    y = self.b(x)\n    return self.c(h)\n", None),  # x used twice
    ("def forward(self, x, mask):\n    return self.c(self.b(self.a(x)))\n", None),  # another argument
    ("def forward(self, x):\n    x = self.a(x)\n    x = x * 2\n    return self.c(x)\n", None),  # another op
    ("def forward(self, x):\n    return self.c(self.b(self.a(x), scale=2))\n", None),  # a keyword
    ("def forward(self, x):\n    return torch.relu(self.a(x))\n", None),  # not a child
])
def test_mlp_chain_reads_the_forward(source, chain):
    namespace = {"torch": torch}
    exec(source, namespace)  # noqa: S102 - a test's own source
    cls = type("Probe", (torch.nn.Module,), {"forward": namespace["forward"]})
    import inspect as _inspect
    from unittest import mock

    with mock.patch.object(_inspect, "getsource", lambda fn: source):
        blocks.mlp_chain.cache_clear()
        got = blocks.mlp_chain(cls)
    blocks.mlp_chain.cache_clear()
    assert got == chain


def test_other_chains_are_not_candidates():
    """A chain of three children that are not linear / activation / linear (convolutions around a
    norm) is not a feed-forward block and is not reported as one left unfused."""
    class Convs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = torch.nn.Conv1d(4, 4, 1), torch.nn.BatchNorm1d(4), torch.nn.Conv1d(4, 4, 1)

        def forward(self, x):
            x = self.a(x)
            x = self.b(x)
            return self.c(x)

    report = xkernels.patch(torch.nn.Sequential(Convs()))
    assert report.blocks == [] and not [m for m in report.left if "feed-forward" in m.reason], str(report)


def test_feed_forward_detection_needs_the_known_children():
    """A BERT layer whose intermediate block is not BERT's, or whose activation xkernels does not
    fuse, keeps its own feed_forward_chunk (reported); a ViT-style MLP whose fc2 has hooks too."""
    tf = require_transformers()
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                        vocab_size=64, max_position_embeddings=32, hidden_act="gelu", **ATTN)
    model = tf.BertModel(cfg)
    model.encoder.layer[0].intermediate.intermediate_act_fn = torch.nn.Tanh()
    report = xkernels.patch(model)
    left = [m for m in report.left if m.name == "encoder.layer.0"]
    assert len(left) == 1 and "intermediate_act_fn (Tanh)" in left[0].reason, str(report)
    assert "feed_forward_chunk" not in model.encoder.layer[0].__dict__
    vit = tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                   image_size=16, patch_size=8, **ATTN), add_pooling_layer=False)
    vit.layers[0].mlp.fc2.register_forward_hook(lambda *a: None)
    report = xkernels.patch(vit)
    assert any(m.name == "layers.0.mlp" and "fc2" in m.reason for m in report.left), str(report)


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


# -- the fused forwards' per-call path (xkernels/block_steps.py) -----------------------------------
def _local_blocks(device):
    """BERT's output block, Llama's MLP and a Llama decoder layer (pass-through attention, a real
    MLP) as the host probe's local classes (transformers' forwards), random parameters."""
    from xkernels.cli.bench_host_blocks import BertSelfOutput, DecoderLayer, LlamaMLP, PassAttention

    torch.manual_seed(0)
    mods = [BertSelfOutput(32), LlamaMLP(32, 48), DecoderLayer(32, PassAttention(), LlamaMLP(32, 48))]
    for m in mods:
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    return [m.to(device).eval() for m in mods]


def _inputs(m, device, dtype=torch.float32):
    x = torch.randn(2, 5, 32, device=device, dtype=dtype)
    return (x, torch.randn(2, 5, 32, device=device, dtype=dtype)) if hasattr(m, "LayerNorm") else (x,)


def _close(got, module, args, ref_module):
    """``got`` against ``module``'s unpatched forward and float64."""
    with torch.no_grad():
        want = type(module).forward(ref_module, *args)
        ref = type(module).forward(copy.deepcopy(ref_module).double(), *(a.double() for a in args))
    assert_model_close(got, want, ref)


def test_repeats_take_the_routes_and_read_parameters_per_call(backend, device, monkeypatch):
    """Repeated patched forwards (no gradient) with fresh inputs match torch each time, and the
    gated MLP's repeats skip gated_linear's check; a state dict loaded and a dtype change after
    patch() are what the next forward computes with."""
    from xkernels.ops import gated_linear

    checks = [0]
    real = gated_linear.check
    monkeypatch.setattr(gated_linear, "check", lambda *a, **k: (checks.__setitem__(0, checks[0] + 1), real(*a, **k))[1])
    gated_linear._forget()  # no route from an earlier test (a generate() of these sizes leaves one): the first call checks
    for module in _local_blocks(device):
        original = copy.deepcopy(module)
        xkernels.patch(module)
        before = checks[0]
        for _ in range(3):
            args = _inputs(module, device)
            with torch.no_grad():
                got = module(*args)
            _close(got, module, args, original)
        if hasattr(module, "gate_proj"):
            assert checks[0] - before == (1 if backend.runs_triton else 0)  # cpu: the class's own forward
        state = {k: torch.randn_like(v) for k, v in original.state_dict().items()}
        original.load_state_dict(state)
        module.load_state_dict(state)
        args = _inputs(module, device)
        with torch.no_grad():
            _close(module(*args), module, args, original)
        module.half()
        args = _inputs(module, device, torch.float16)
        with torch.no_grad():
            got = module(*args)
        assert got.dtype == torch.float16
        _close(got, module, args, original.half())


def test_block_records_are_resolved_at_patch_time_and_copied(device):
    """The record of each fused forward holds what patch() resolved (norm, kind, eps attribute,
    return_sum; projections, activation); a deep copy gets its own record with an empty route
    cache; undo removes it."""
    bert, mlp, layer = _local_blocks(device)
    report = xkernels.patch(torch.nn.ModuleList([bert, mlp, layer]))
    rec = bert._xkernels_block
    assert (rec.norm, rec.layer, rec.eps_attr, rec.return_sum) == ("LayerNorm", True, "eps", False)
    rec = layer._xkernels_block
    assert (rec.norm, rec.layer, rec.eps_attr, rec.offset, rec.return_sum) == (
        "post_attention_layernorm", False, "variance_epsilon", 0.0, True)
    assert layer.input_layernorm._xkernels_block.norm is None
    assert (mlp._xkernels_block.proj, mlp._xkernels_block.activation) == (("gate_proj", "up_proj"), "silu")
    with pytest.raises(AttributeError):
        rec.eps_attr = "eps"  # frozen
    twin = copy.deepcopy(layer)
    assert twin._xkernels_block == layer._xkernels_block and twin._xkernels_block is not layer._xkernels_block
    assert twin._xkernels_block.routes is not layer._xkernels_block.routes and not twin._xkernels_block.routes.routes
    report.undo()
    assert not any("_xkernels_block" in m.__dict__ for m in (bert, mlp, layer))


def test_children_replaced_after_patch_take_the_general_way(backend, device):
    """A norm replaced by another kind, a projection replaced by a Linear subclass: the fused
    forward notices the class and computes what the module now holds."""
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    _, mlp, layer = _local_blocks(device)
    xkernels.patch(layer)
    xkernels.patch(mlp)
    ln = torch.nn.LayerNorm(32).to(device)
    layer.post_attention_layernorm = ln
    scaled = Scaled(32, 48, bias=False).to(device)
    mlp.gate_proj = scaled
    for module in (layer, mlp):
        args = _inputs(module, device)
        with torch.no_grad():
            got = module(*args)
        _close(got, module, args, module)


def _a_compiled_rule_everywhere(monkeypatch):
    """Stand in for a device whose add_norm table holds a compiled rule (sm90's): a backend running
    Triton traces the fused forwards of compiled training calls; the form itself then finds no
    rule for the interpreter's arch (and no ``@triton.jit`` kernel to launch) and traces the norm
    class's forward. The real ``available`` says no on every CPU backend."""
    for name in ("cpu", "interpreter", "interpreter-npu"):
        be = xkernels.dispatch.get_backend(name)
        if be.unavailable_reason() is None:
            with xkernels.dispatch.use_backend(be):
                assert not add_norm_compiled.available(torch.device("cpu")), name
    stand_in = torch.compiler.assume_constant_result(
        lambda device, dropout=False: xkernels.dispatch.select(device).runs_triton)
    monkeypatch.setattr(add_norm_compiled, "available", stand_in)  # a Dynamo constant, as the real one


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_compiled_patched_models_trace_the_original_forwards(device, monkeypatch, train):
    """While torch.compile traces an inference call, every fused block runs its class's own
    forward (the compiler fuses adds, norms and gates itself; the fused ops' nodes measured slower
    there on an H100): no block step is called. A training call reaches the decoder layers' add +
    norm steps only (``block_steps.norm_block_as_written``), which trace the norm class's own forward
    where the table has no measured compiled rule (none for the interpreter). Outputs and gradients
    match the unpatched compiled model."""
    tf = require_transformers()
    _a_compiled_rule_everywhere(monkeypatch)
    torch.manual_seed(0)
    model = _llama_like(tf, "llama").to(device)
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 7), device=device)
    xkernels.patch(model)
    assert _counts(xkernels.patch(copy.deepcopy(ref))) == EXPECTED["llama"]
    calls, forms = [], []
    for m in model.modules():
        step = m.__dict__.get("_xkernels_block")
        if step is not None:
            monkeypatch.setattr(m, "_xkernels_block", lambda *a, _s=step: (calls.append(type(_s)), _s(*a))[1])
    real_rotary = rotary.RotaryPlan.run  # the rotary fusion hands every traced call to the original
    monkeypatch.setattr(rotary.RotaryPlan, "run", lambda *a: (calls.append("rotary"), real_rotary(*a))[1])
    real_form = add_norm_compiled.add_norm
    monkeypatch.setattr(add_norm_compiled, "add_norm",
                        lambda *a: (lambda out: (forms.append(out), out)[1])(real_form(*a)))
    torch._dynamo.reset()
    got, got_grads = _run(torch.compile(model, backend="aot_eager", fullgraph=False), ids, train)
    want, want_grads = _run(torch.compile(ref, backend="aot_eager", fullgraph=False), ids, train)
    torch._dynamo.reset()
    if not train:
        assert calls == [] and forms == []
    else:
        layers = model.config.num_hidden_layers
        assert calls == ([NormStep] * layers if xkernels.dispatch.select(device).runs_triton else []), calls
        assert forms == [None] * len(calls)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["bert", "gpt2", "vit"])
def test_compiled_training_traces_the_fused_forwards_of_post_and_pre_norm_blocks(device, family, monkeypatch):
    """A training step under torch.compile (dropout 0) where a compiled rule exists traces the
    fused forwards of BERT's output blocks, GPT-2's blocks and ViT's layers
    (``block_steps.norm_block_as_written``): outputs and every gradient match the unpatched
    compiled model's."""
    tf = require_transformers()
    _a_compiled_rule_everywhere(monkeypatch)
    torch.manual_seed(0)
    if family == "bert":
        model = tf.BertModel(tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=64, vocab_size=64, max_position_embeddings=32,
                                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **ATTN))
        x = torch.randint(0, 64, (2, 6), device=device)
    elif family == "gpt2":
        model = tf.GPT2Model(tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32,
                                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ATTN))
        x = torch.randint(0, 64, (2, 6), device=device)
    else:
        model = tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, image_size=16, patch_size=8, **ATTN),
                            add_pooling_layer=False)
        x = torch.randn(2, 3, 16, 16, device=device)
    model = model.to(device).train()
    ref = copy.deepcopy(model)
    xkernels.patch(model)

    def step(m):
        m.zero_grad(set_to_none=True)
        out = torch.compile(m, backend="aot_eager")(x).last_hidden_state
        out.sum().backward()
        return out, [p.grad for p in m.parameters() if p.grad is not None]

    torch._dynamo.reset()
    got, got_grads = step(model)
    want, want_grads = step(ref)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(got_grads) == len(want_grads)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


class _CountedStep:
    """A block's step that records how the fused forward called it: ``"call"`` or ``"dropped"``."""

    def __init__(self, step, calls):
        self.step, self.calls = step, calls

    def __call__(self, *args):
        self.calls.append("call")
        return self.step(*args)

    def dropped(self, *args):
        self.calls.append("dropped")
        return self.step.dropped(*args)


def _count_norm_steps(model, monkeypatch):
    calls = []
    for m in model.modules():
        step = m.__dict__.get("_xkernels_block")
        if isinstance(step, NormStep):
            monkeypatch.setattr(m, "_xkernels_block", _CountedStep(step, calls))
    return calls


def test_compiled_training_hands_bert_output_dropout_to_the_step(device, monkeypatch):
    """Under torch.compile a training call reaches a BERT output block's add + norm step where its
    only active dropout is its own ``dropout`` child, a plain ``nn.Dropout`` without hooks, which the
    fused forward hands to the step (``NormStep.dropped``: inside the compiled form's kernels where a
    ``compiled_dropout`` rule takes the call): in eval mode (dropout inactive, parameters still
    requiring grad) each of the 2 x layers output blocks calls its step; in train mode with hidden
    dropout 0.1 each hands its dropout over; with a hook on a dropout, or the dropout a subclass,
    that block keeps its class's forward. On a backend running Triton, where a compiled rule exists
    (the device's own tables first: none for the CPU backends' arch, no step called; then with a
    rule standing in everywhere). Outputs and gradients equal the unpatched compiled model's under
    the same seed (the CPU backends have no dropout rule: the step applies the module, then the norm)."""
    tf = require_transformers()
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=64, max_position_embeddings=32, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.0, **ATTN)
    torch.manual_seed(0)
    model = tf.BertModel(cfg).to(device)
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 6), device=device)
    xkernels.patch(model)
    calls = _count_norm_steps(model, monkeypatch)
    sites = 2 * cfg.num_hidden_layers if xkernels.dispatch.select(device).runs_triton else 0
    ruled = sites if add_norm_compiled.available(device) else 0  # the device's own tables (sm90: rules)

    def step(m, seed=5):
        torch._dynamo.reset()
        m.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        out = torch.compile(m, backend="aot_eager")(ids).last_hidden_state
        out.sum().backward()
        return out, [q.grad for q in m.parameters() if q.grad is not None]

    model.eval()
    calls.clear()
    step(model)
    assert calls == ["call"] * ruled, calls
    _a_compiled_rule_everywhere(monkeypatch)  # from here a compiled rule stands in everywhere
    for mode, expected in (("eval", ["call"] * sites), ("train", ["dropped"] * sites)):
        getattr(model, mode)()
        ref.train(mode == "train")
        calls.clear()
        got, got_grads = step(model)
        assert calls == expected, (mode, calls)
        want, want_grads = step(ref)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert len(got_grads) == len(want_grads)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    first = model.encoder.layer[0]
    handle = first.output.dropout.register_forward_hook(lambda *a: None)
    calls.clear()
    step(model)
    assert calls == ["dropped"] * (sites - 1), calls  # the hooked block: its class's forward
    handle.remove()

    class OwnDropout(torch.nn.Dropout):
        pass

    first.attention.output.dropout = OwnDropout(0.1)
    calls.clear()
    step(model)
    assert calls == ["dropped"] * (sites - 1), calls
    torch._dynamo.reset()


def test_compiled_training_keeps_gpt2s_class_forward_where_its_dropout_is_active(device, monkeypatch):
    """GPT-2's residual dropout runs inside its attention and MLP modules, not in the block's own
    forward: with it active a compiled training call keeps the block's class forward (no step is
    called), and reaches the steps with it at 0."""
    tf = require_transformers()
    _a_compiled_rule_everywhere(monkeypatch)
    for pdrop, expected in ((0.1, 0), (0.0, 2)):
        torch.manual_seed(0)
        model = tf.GPT2Model(tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32,
                                           resid_pdrop=pdrop, embd_pdrop=0.0, attn_pdrop=0.0, **ATTN))
        model = model.to(device).train()
        xkernels.patch(model)
        calls = _count_norm_steps(model, monkeypatch)
        torch._dynamo.reset()
        torch.compile(model, backend="aot_eager")(torch.randint(0, 64, (2, 6), device=device)).last_hidden_state.sum(
        ).backward()
        runs = expected if xkernels.dispatch.select(device).runs_triton else 0
        assert calls == ["call"] * runs, (pdrop, calls)
    torch._dynamo.reset()


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                             (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_t5_rms_norm_fused_where_dtypes_match(backend, device, x_dtype, w_dtype):
    """T5's RMSNorm casts to a half weight's dtype, not the input's: the op's math where the input
    and the weight share a dtype (fused, within the op's tolerance of the float64 norm), the
    class's own forward, bit for bit, where they do not."""
    require_transformers()
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    torch.manual_seed(0)
    norm = T5LayerNorm(32, eps=1e-6).to(device)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(32) + 0.5)
    norm = norm.to(w_dtype)
    fused = copy.deepcopy(norm)
    report = xkernels.patch(fused)
    assert _counts(report) == {"rms norm": 1}, str(report)
    x = torch.randn(3, 5, 32, device=device).to(x_dtype)
    with torch.no_grad():
        want, got = norm(x), fused(x)
    assert got.dtype == want.dtype
    if x_dtype is not w_dtype:
        assert torch.equal(got, want)
    else:
        ref = norm.double()(x.double())
        assert_model_close(got, want, ref)


def _count_forwards(monkeypatch, *classes) -> dict:
    """Counts each class's own ``forward`` calls (a fused forward runs none of its module's)."""
    counts = {c.__name__: 0 for c in classes}
    for cls in classes:
        real = cls.forward

        def counted(self, *args, _real=real, _name=cls.__name__, **kwargs):
            counts[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "forward", counted)
    return counts


#: per family: the model, the norm class and the gated MLP class (or None) whose own forwards count
AUTOCAST_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaRMSNorm", "LlamaMLP"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "GemmaRMSNorm", "GemmaMLP"),
    "bert": ("BertConfig", "BertModel", "LayerNorm", None),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "LayerNorm", None),
    "bart": ("BartConfig", "BartModel", "LayerNorm", None),
}


@pytest.mark.parametrize("family,amp", [(f, torch.bfloat16) for f in AUTOCAST_FAMILIES] + [("llama", torch.float16)],
                         ids=[*AUTOCAST_FAMILIES, "llama-fp16"])
def test_blocks_fuse_under_autocast_where_the_norm_computes_in_fp32(backend, device, monkeypatch, family, amp):
    """Mixed-precision training (fp32 parameters, bf16 autocast; fp16 for Llama): the patched model's output and
    fp32 gradients against the unpatched model's under autocast and float64, and the same fusions
    ran as without autocast: the norm class forwards that run are those of the norms no fusion
    takes (GPT-2's ln_1, BART's embedding norms, BERT's embeddings whose position embeddings
    broadcast over the batch), and a gated MLP's training call runs fused. In a half model under
    autocast the norms see half sums, where the fused op's dtype is not autocast's: every norm runs
    its own forward there, as every norm and gated MLP does on a backend that runs no kernels (cpu)."""
    tf = require_transformers()
    config, model_cls, norm_name, mlp_name = AUTOCAST_FAMILIES[family]
    kw = dict(vocab_size=64, max_position_embeddings=32, num_hidden_layers=2, num_attention_heads=2, **ATTN)
    kw.update({"bert": dict(hidden_size=32, intermediate_size=64, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0),
               "gpt2": dict(n_embd=32, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0),
               "bart": dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                            decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=48, dropout=0.0,
                            attention_dropout=0.0, activation_dropout=0.0),
               "gemma": dict(hidden_size=32, intermediate_size=48, head_dim=16, num_key_value_heads=2,
                             hidden_act="gelu_pytorch_tanh"),
               }.get(family, dict(hidden_size=32, intermediate_size=48, num_key_value_heads=2)))
    if family in ("gpt2", "bart"):
        kw = {k: v for k, v in kw.items() if k not in ("num_hidden_layers", "num_attention_heads")}
    torch.manual_seed(0)
    model = getattr(tf, model_cls)(getattr(tf, config)(**kw)).to(device).train()
    ref64 = copy.deepcopy(model).double()
    ids = torch.randint(3, 64, (2, 7), device=device)
    inputs = {"input_ids": ids, **({"decoder_input_ids": ids[:, :5]} if family == "bart" else {})}

    def run(m, cast=True):
        m.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp, enabled=cast):
            out = m(**inputs)
        out = out.logits if hasattr(out, "logits") else out.last_hidden_state
        out.float().sum().backward()
        return out, [p.grad for p in m.parameters() if p.grad is not None]

    want, want_grads = run(model)
    ref, ref_grads = run(ref64, cast=False)
    half_model = copy.deepcopy(model).to(amp)
    report = xkernels.patch(model)
    xkernels.patch(half_model)
    modules = __import__(type(model).__module__, fromlist=["_"])
    norm_cls = torch.nn.LayerNorm if norm_name == "LayerNorm" else getattr(modules, norm_name)
    classes = (norm_cls,) + ((getattr(modules, mlp_name),) if mlp_name else ())
    counts = _count_forwards(monkeypatch, *classes)
    run(model, cast=False)
    without = dict(counts)
    counts.update({k: 0 for k in counts})
    got, got_grads = run(model)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert_model_close(got.float(), want.detach().float(), ref.detach())
    assert len(got_grads) == len(want_grads)
    for g, w, r in zip(got_grads, want_grads, ref_grads):
        assert g.dtype == w.dtype == torch.float32
        assert_model_close(g, w, r)
    assert counts == without, (counts, without, report.counts())
    if backend.runs_triton:
        assert counts[norm_cls.__name__] <= {"gpt2": 3, "bart": 2, "bert": 1}.get(family, 0), counts
        assert counts.get(mlp_name, 0) == 0, counts
    else:  # every block runs the code it replaces
        assert counts[norm_cls.__name__] > 2 * 2 and (not mlp_name or counts[mlp_name] == 2), counts
    counts.update({k: 0 for k in counts})
    run(half_model)
    assert counts[norm_cls.__name__] > 2 * 2, counts  # at least two norms per layer, each its own forward
    report.undo()


def test_a_norm_with_fp32_weight_on_a_half_input_runs_its_own_forward(backend, device):
    """Outside autocast, Llama's RMSNorm returns fp32 for a bf16 input with an fp32 weight (the
    fused op would give bf16): the patched norm runs its class's forward there, and fuses where the
    dtypes agree."""
    tf = require_transformers()
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    model = tf.LlamaModel(tf.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                         num_attention_heads=2, vocab_size=64, **ATTN)).to(device)
    xkernels.patch(model)
    norm = model.norm
    x = torch.randn(2, 5, 32, device=device).to(torch.bfloat16)
    want = LlamaRMSNorm.forward(norm, x)
    got = norm(x)
    assert want.dtype == got.dtype == torch.float32
    assert torch.equal(got, want)
    norm.to(torch.bfloat16)
    assert norm(x).dtype == torch.bfloat16


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_blocks_run_their_own_code_on_a_backend_that_runs_no_kernels(monkeypatch, family):
    """On the cpu backend (PyTorch's ops) a patched model's fused blocks, norms, gated MLPs,
    rotary embeddings and linear layers run the code they replace: no op is called, and output and gradients
    equal the unpatched model's bit for bit. Forcing a kernel backend (the interpreter) on the same
    model calls them; the report says where the blocks run as written."""
    tf = require_transformers()
    from xkernels import ops

    called = []
    for name in ("add_rms_norm", "add_layer_norm", "gated_linear", "rotary_embedding", "linear"):
        getattr(ops, name)._forget()  # no route from an earlier test: the interpreter's first calls check
        cls = type(getattr(ops, name))
        real = cls.check  # every call of an op on a backend without routes (a first call on the others)

        def spy(self, *a, _real=real, **k):
            called.append(self.name)
            return _real(self, *a, **k)

        monkeypatch.setattr(cls, "check", spy)
    torch.manual_seed(0)
    if family == "llama":
        model = _llama_like(tf, "llama")
    else:
        model = tf.BertForMaskedLM(tf.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                 num_attention_heads=2, vocab_size=64, hidden_dropout_prob=0.0,
                                                 attention_probs_dropout_prob=0.0, **ATTN))
    ids = torch.randint(3, 64, (2, 7))
    original = copy.deepcopy(model)
    report = xkernels.patch(model)
    assert report.blocks and "the cpu backend" in str(report)
    with xkernels.use_backend("cpu"):
        for train in (True, False, True):  # a first call and repeats
            got, got_grads = _run(model, ids, train)
            want, want_grads = _run(original, ids, train)
            assert torch.equal(got, want)
            assert len(got_grads) == len(want_grads) and all(map(torch.equal, got_grads, want_grads))
    assert called == []
    kernels = xkernels.dispatch.get_backend("interpreter")
    if not kernels.is_available():  # (a device host's numpy may be newer than Triton 3.6's interpreter takes)
        pytest.skip(f"the cpu backend part passed; no kernel backend for cpu tensors here: {kernels.unavailable_reason()}")
    with xkernels.use_backend(kernels.name), torch.no_grad():
        model(ids)
    assert called, "a kernel backend runs the fused ops"
