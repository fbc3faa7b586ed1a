"""``xkernels.activation_forms``: a linear layer whose output a forward hands straight to an
activation module, read from source, is fused by ``patch()`` in any class (OPT's decoder layer)."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import patch_matches_float64, require_transformers
from xkernels.activation_forms import linear_activation_pairs
from xkernels.mask_decisions import FUSION as MASKS


class Inline(torch.nn.Module):
    """A layer written inline: norm, up, activation, down, residual."""

    def __init__(self, d: int = 16, f: int = 32) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1, self.act, self.fc2 = torch.nn.Linear(d, f), torch.nn.GELU(), torch.nn.Linear(f, d)

    def forward(self, x):
        residual = x
        h = self.norm(x)
        h = self.fc1(h)
        h = self.act(h)
        h = self.fc2(h)
        return residual + h


class Nested(Inline):
    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class ReadsPreActivation(Inline):
    def forward(self, x):
        h = self.fc1(x)
        g = self.act(h)
        return self.fc2(g + h)


class StatementBetween(Inline):
    def forward(self, x):
        h = self.fc1(x)
        h = h * 2
        h = self.act(h)
        return self.fc2(h)


class LayerTwice(Inline):
    def forward(self, x):
        h = self.act(self.fc1(x))
        return self.fc2(h) + self.fc1(x).sum()


class ActivationTwice(Inline):
    def forward(self, x):
        h = self.act(self.fc1(x))
        return self.act(self.fc2(h))


class HelperReadsLayer(Inline):
    """Other code may call ``pre_activation``: fusing fc1 with act would change what it returns."""

    def pre_activation(self, x):
        return self.fc1(x)


class OtherNames(Inline):
    def forward(self, x):
        y = self.fc1(x)
        z = self.act(y)
        return self.fc2(z)


@pytest.mark.parametrize("cls, pairs", [
    (Inline, (("norm", "fc1"), ("fc1", "act"), ("act", "fc2"))),  # patch checks which are (linear, activation)
    (Nested, (("fc1", "act"), ("act", "fc2"), ("norm", "fc1"))),
    (ReadsPreActivation, ()), (StatementBetween, ()), (HelperReadsLayer, (("act", "fc2"),)),
    (LayerTwice, ()), (ActivationTwice, ()), (OtherNames, ()),
    (torch.nn.Linear, ())])
def test_pairs_read_from_the_forward(cls, pairs):
    assert set(linear_activation_pairs(cls)) == set(pairs)


@pytest.mark.parametrize("cls", [Inline, Nested])
def test_patch_fuses_an_inline_pair_exactly(backend, device, cls):
    torch.manual_seed(0)
    model = torch.nn.Sequential(cls(), cls()).to(device)
    report = patch_matches_float64(model, torch.randn(3, 5, 16, device=device))
    assert [(e.name, e.activation, e.activation_module) for e in report.replaced if e.activation] == [
        ("0.fc1", "gelu", "0.act"), ("1.fc1", "gelu", "1.act")]
    assert not report.left and isinstance(model[0].act, torch.nn.Identity)
    report.undo()
    assert isinstance(model[0].act, torch.nn.GELU) and type(model[0].fc1) is torch.nn.Linear


@pytest.mark.parametrize("cls", [ReadsPreActivation, StatementBetween, LayerTwice, HelperReadsLayer])
def test_other_forwards_keep_their_activation(cls):
    model = cls()
    report = xkernels.patch(model)
    assert not [e for e in report.replaced if e.activation] and isinstance(model.act, torch.nn.GELU)


def test_a_module_after_a_layer_that_is_no_activation_xkernels_fuses_is_not_reported():
    """GPT-2's ``c_proj`` then ``resid_dropout``, BERT's pooler ``dense`` then ``Tanh``: the layer is
    swapped plain and nothing is listed as left for it."""
    class Pooler(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense, self.activation, self.drop = torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Dropout(0.0)

        def forward(self, x):
            return self.drop(self.activation(self.dense(x)))

    report = xkernels.patch(Pooler())
    assert not report.left and [(e.name, e.activation) for e in report.replaced] == [("dense", None)]


def test_opts_decoder_layer_fuses_fc1_with_its_activation():
    """OPT writes fc1, the activation and fc2 inline in its decoder layer, whose post-norm add +
    norm sites are rewritten too; both fusions hold (tests/test_patch_families.py checks the numbers)."""
    tf = require_transformers()
    cfg = tf.OPTConfig(hidden_size=32, ffn_dim=48, num_attention_heads=4, num_hidden_layers=2, vocab_size=64,
                       word_embed_proj_dim=32, max_position_embeddings=64)
    report = xkernels.patch(tf.OPTForCausalLM(cfg))
    assert report.counts() == {"residual add + norm (post-norm)": 2, "linear + activation": 2, "linear": 11,
                               MASKS: 1}  # the decoder's mask creation
    assert [e.name for e in report.replaced if e.activation == "relu"] == [
        "model.decoder.layers.0.fc1", "model.decoder.layers.1.fc1"]


def test_blooms_mlp_fuses_its_tanh_gelu():
    """BLOOM applies its own GELU module (``BloomGelu``: the tanh formula, with that formula's
    derivative as its backward) straight to ``dense_h_to_4h``'s output."""
    tf = require_transformers()
    report = xkernels.patch(tf.BloomForCausalLM(tf.BloomConfig(hidden_size=32, n_head=4, n_layer=2, vocab_size=64)))
    assert report.counts() == {"linear + activation": 2, "linear": 7, MASKS: 1} and not report.left
    assert {e.activation for e in report.replaced if e.activation} == {"gelu_tanh"}


@pytest.mark.parametrize("family", ["clip", "convnext", "t5_relu", "persimmon"])
def test_families_whose_first_layer_an_activation_follows_fuse_it(family):
    """CLIP's MLP (fc1 then QuickGELU, adjacent statements), ConvNeXt's block (pwconv1 then GELU,
    with a layer norm and a permute around them), the original T5's ``DenseReluDense`` (wi then
    ReLU) and Persimmon's MLP (dense_h_to_4h then the squared ReLU) fuse their first layer with its
    activation (tests/test_patch_families.py checks the numbers)."""
    tf = require_transformers()
    models = {
        "clip": lambda: tf.CLIPVisionModel(tf.CLIPVisionConfig(hidden_size=32, intermediate_size=48,
                                                                num_hidden_layers=2, num_attention_heads=4,
                                                                image_size=32, patch_size=8)),
        "convnext": lambda: tf.ConvNextModel(tf.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                                                                image_size=32, patch_size=4)),
        "t5_relu": lambda: tf.T5Model(tf.T5Config(d_model=32, d_ff=48, num_layers=1, num_heads=4, d_kv=8,
                                                  vocab_size=64, feed_forward_proj="relu")),
        "persimmon": lambda: tf.PersimmonForCausalLM(tf.PersimmonConfig(hidden_size=32, intermediate_size=48,
                                                                        num_hidden_layers=2, num_attention_heads=4,
                                                                        vocab_size=64)),
    }
    want = {"clip": ("mlp.fc1", "quick_gelu", 2), "convnext": ("pwconv1", "gelu", 2),
            "t5_relu": ("DenseReluDense.wi", "relu", 2), "persimmon": ("mlp.dense_h_to_4h", "relu2", 2)}[family]
    report = xkernels.patch(models[family]())
    fused = [(e.name, e.activation) for e in report.replaced if e.activation]
    assert not report.left and len(fused) == want[2], report
    assert all(name.endswith(want[0]) and act == want[1] for name, act in fused), fused
