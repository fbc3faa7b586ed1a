"""``xkernels.add_norm_forms``: a forward's ``self.<norm>(a + b)`` and ``h = a + b; h =
self.<norm>(h)`` sites (post-norm), and ``s = a + b`` kept as the next residual before
``self.<norm>(s)`` (pre-norm), rewritten to the fused add + norm, the rest of the forward
unchanged; the sites found and the forwards left alone, outputs and gradients against the float64
module, the per-call fallbacks (broadcast, a replaced norm), and the families written that way
(BART, DistilBERT, GTE post-norm; Whisper, mBART, Pegasus pre-norm), with gradient checkpointing
still recomputing a rewritten layer."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

import xkernels
from helpers import assert_model_close, tiny_model
from xkernels.add_norm_forms import add_norm_form
from xkernels.block_steps import add_norm_and_sum, add_then_norm

FUSION = "residual add + norm (post-norm)"
PRE_NORM = "residual add + norm (pre-norm)"
BOTH = "residual add + norm (post- and pre-norm)"


def _form(cls):
    return add_norm_form(cls, add_then_norm, add_norm_and_sum)


class PostNorm(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, d), nn.Linear(d, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.dropout = 0.0

    def forward(self, hidden_states, scale=None):
        residual = hidden_states
        hidden_states = self.fc1(hidden_states)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = residual + hidden_states
        hidden_states = self.norm1(hidden_states)
        if scale is not None:
            hidden_states = hidden_states * scale
        return self.norm2(self.fc2(hidden_states) + hidden_states)


class InBranch(PostNorm):
    def forward(self, x, flag=True):
        if flag:
            x = self.fc1(x) + x
            x = self.norm1(x)
        return x


class TwoInputs(PostNorm):
    def forward(self, x, y):
        return self.norm1(self.fc1(x) + y)


class SumKept(PostNorm):
    def forward(self, x):
        s = self.fc1(x) + x
        y = self.norm1(s)
        return y + s


class PreNorm(PostNorm):
    """Whisper's, mBART's layer: the sum aliased as the next residual, the norm rebinding its name."""

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.norm1(hidden_states)
        hidden_states = self.fc1(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.norm2(hidden_states)
        hidden_states = self.fc2(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class AliasKept(PostNorm):
    """The alias read after the norm went to another name: the alias is assigned the sum after."""

    def forward(self, x):
        h = self.fc1(x) + x
        residual = h
        y = self.norm1(h)
        return self.fc2(y) + residual + h


class Mixed(PostNorm):
    def forward(self, x):
        s = self.fc1(x) + x
        y = self.norm1(s)
        return self.norm2(self.fc2(y) + s)


def _passthrough(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


class Decorated(PostNorm):
    @_passthrough
    def forward(self, x):
        return self.norm1(self.fc1(x) + x)


class CallsSuper(PostNorm):
    def forward(self, x):
        return self.norm1(super().forward(x) + x)


def test_sites_are_found_and_rewritten():
    fn, plain, summed = _form(PostNorm)
    assert (plain, summed) == (("norm1", "norm2"), ())
    assert fn is not PostNorm.forward and fn.__code__.co_filename == PostNorm.forward.__code__.co_filename
    assert _form(InBranch).plain == ("norm1",)
    for cls, plain, summed in ((SumKept, (), ("norm1",)), (PreNorm, (), ("norm2",)), (AliasKept, (), ("norm1",)),
                               (Mixed, ("norm2",), ("norm1",))):
        form = _form(cls)
        assert (form.plain, form.summed) == (plain, summed), cls


@pytest.mark.parametrize("cls", [Decorated, CallsSuper])
def test_other_forwards_are_left(cls):
    assert _form(cls) is None
    assert not any(b.fusion.startswith("residual add + norm") for b in xkernels.patch(cls()).blocks)


def _step(m, *args):
    m.zero_grad(set_to_none=True)
    y = m(*args)
    y.double().square().mean().backward()
    return y.detach(), [p.grad for p in m.parameters()]


@pytest.mark.parametrize("cls, fusion", [(PostNorm, FUSION), (SumKept, PRE_NORM), (PreNorm, PRE_NORM),
                                         (AliasKept, PRE_NORM), (Mixed, BOTH)])
def test_rewritten_forward_matches_float64(backend, device, cls, fusion):
    """Outputs and every gradient against the float64 module: the sum of a pre-norm site reaches
    its later reads (and their gradients flow back through the fused op)."""
    torch.manual_seed(0)
    model = cls().to(device).train()
    with torch.no_grad():
        for n in (model.norm1, model.norm2):
            n.weight.add_(torch.randn_like(n.weight) * 0.1)
            n.bias.add_(torch.randn_like(n.bias) * 0.1)
    ref64 = copy.deepcopy(model).double()
    fused = copy.deepcopy(model)
    report = xkernels.patch(fused)
    assert [b.fusion for b in report.blocks] == [fusion], str(report)
    x = torch.randn(3, 5, 32, device=device)
    for args in ((), (torch.tensor(0.5, device=device),)) if cls is PostNorm else ((),):  # PostNorm's scale
        want, want_g = _step(model, x, *args)
        got, got_g = _step(fused, x, *args)
        ref, ref_g = _step(ref64, x.double(), *(a.double() for a in args))
        assert_model_close(got, want, ref)
        assert [g is None for g in got_g] == [w is None for w in want_g]  # (a norm the forward never calls)
        for g, w, r in zip(got_g, want_g, ref_g):
            if w is not None:
                assert_model_close(g, w, r)
    report.undo()
    assert "forward" not in fused.__dict__


def test_pre_norm_sites_fuse_training_calls_only(backend, device, monkeypatch):
    """A pre-norm site's inference call runs as written (its fused op saves a pass of device time
    and costs more host time than the add and the norm); a call needing a gradient fuses, and the
    report says so."""
    from xkernels import block_steps
    from xkernels.patching import PRE_NORM_SITES

    torch.manual_seed(0)
    model = PreNorm().to(device)
    fused = copy.deepcopy(model)
    (block,) = xkernels.patch(fused).blocks
    assert block.fusion == PRE_NORM and PRE_NORM_SITES in block.note, block
    calls = []
    real = block_steps.NormStep.__call__
    monkeypatch.setattr(block_steps.NormStep, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    x = torch.randn(3, 5, 32, device=device)
    with torch.no_grad():  # the class's source on the same (replaced) linear layers, bit for bit
        assert torch.equal(fused(x), PreNorm.forward(fused, x)) and calls == []
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)
    fused(x.requires_grad_()).sum().backward()
    assert calls == ([1] if xkernels.dispatch.runs_kernels(x.device) else [])


def test_broadcast_and_replaced_norm_run_as_written(backend, device):
    """Operands that differ in shape (a broadcast) and a norm replaced after patch() take the
    source's own expression: the class's source on the same children (the linear layers patch()
    replaced, whose kernel may round differently from torch's), bit for bit; operands of one
    shape, the op."""
    torch.manual_seed(0)
    model = TwoInputs().to(device)
    fused = copy.deepcopy(model)
    assert [b.fusion for b in xkernels.patch(fused).blocks] == [FUSION]
    x, y = torch.randn(3, 5, 32, device=device), torch.randn(3, 5, 32, device=device)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, y), model(x, y), rtol=1e-5, atol=1e-5)
        # (1, 5, 32) broadcast to (3, 5, 32)
        assert torch.equal(fused(x, y[:1]), TwoInputs.forward(fused, x, y[:1]))
        fused.norm1 = nn.Identity()
        model.norm1 = nn.Identity()
        assert torch.equal(fused(x, y), TwoInputs.forward(fused, x, y))
        torch.testing.assert_close(fused(x, y), model(x, y), rtol=1e-5, atol=1e-5)


def test_the_report_says_which_sites_run_as_written(device):
    """The report's line for a rewritten forward names the calls that run as written (a broadcast,
    as BERT's embeddings at batch > 1, other devices or dtypes), so a fused line is not read as
    every call fused."""
    model = TwoInputs().to(device)
    (block,) = xkernels.patch(model).blocks
    assert block.fusion == FUSION and "a broadcast" in block.note and "runs as written" in block.note, block


_SEQ2SEQ = dict(d_model=32, encoder_ffn_dim=48, decoder_ffn_dim=48, encoder_layers=1, decoder_layers=1,
                encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=64, max_position_embeddings=64,
                dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)

#: family -> (config, model, config arguments, the fusion its layers take, how many layers take it at least)
FAMILIES = {
    "bart": ("BartConfig", "BartModel", _SEQ2SEQ, FUSION, 2),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=32, n_layers=1, n_heads=4, hidden_dim=48,
                                                               vocab_size=64, max_position_embeddings=64, dropout=0.0,
                                                               attention_dropout=0.0), FUSION, 2),
    "gte": ("GteConfig", "GteModel", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                          num_attention_heads=4, vocab_size=64, max_position_embeddings=64,
                                          hidden_dropout_prob=0.0), FUSION, 1),
    "mbart": ("MBartConfig", "MBartModel", _SEQ2SEQ, PRE_NORM, 2),
    "pegasus": ("PegasusConfig", "PegasusModel", _SEQ2SEQ, PRE_NORM, 2),
    "whisper": ("WhisperConfig", "WhisperModel", dict(_SEQ2SEQ, num_mel_bins=8, max_source_positions=8, pad_token_id=0,
                                                      max_target_positions=16), PRE_NORM, 2),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_families_fuse_and_checkpoint(backend, device, family):
    """Each family's layers take the rewritten forward (outputs and gradients against float64),
    and with gradient checkpointing on, each rewritten layer still runs again in the backward."""
    cfg_name, model_name, kwargs, fusion, sites = FAMILIES[family]
    model, inputs = tiny_model(cfg_name, model_name, kwargs, device)
    if family == "whisper":  # log-mel frames: twice the encoder's positions
        inputs = {"input_features": torch.randn(2, 8, 16, device=device),
                  "decoder_input_ids": inputs["decoder_input_ids"]}
    ref64 = copy.deepcopy(model).double()

    def step(m):
        m.zero_grad(set_to_none=True)
        y = m(**{k: v.double() if m is ref64 and v.is_floating_point() else v for k, v in inputs.items()})
        y = y.last_hidden_state
        y.double().square().mean().backward()
        return y.detach(), [(n, p.grad) for n, p in m.named_parameters() if p.grad is not None]

    want, want_g = step(model)
    ref, ref_g = step(ref64)
    report = xkernels.patch(model)
    rewritten = [b for b in report.blocks if b.fusion == fusion]
    assert len(rewritten) >= sites, str(report)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if "forward" in m.__dict__ and getattr(m, "gradient_checkpointing", False)]
    assert layers, "no rewritten layer is a checkpointing layer"
    calls: list[nn.Module] = []
    for layer in layers:
        attn = next(c for c in layer.children() if "attention" in type(c).__name__.lower())
        attn.register_forward_pre_hook(lambda m, a, layer=layer: calls.append(layer))
    got, got_g = step(model)
    assert len(calls) == 2 * len(layers), f"{len(calls)} calls for {len(layers)} checkpointed layers"
    assert_model_close(got, want, ref)
    assert [n for n, _ in got_g] == [n for n, _ in want_g]
    for (name, g), (_, w), (_, r) in zip(got_g, want_g, ref_g):
        try:
            assert_model_close(g, w, r)
        except AssertionError as e:
            raise AssertionError(f"{family}: gradient of {name}: {e}") from None
