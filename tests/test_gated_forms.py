"""``xkernels.gated_forms``: which gated MLP forwards ``patch()`` reads as ``act(gate(x)) * up(x)``
and what follows the product, then the fused forward run against the module's own: with dropout
active in training (the same random draws, so the same mask), T5's cast, and the families written
that way (T5 v1.1, UMT5, GTE, Seed-OSS)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import xkernels
from helpers import tiny_model
from xkernels.gated_forms import GatedForm, gated_form


class _Base(nn.Module):
    def __init__(self, d: int = 16, h: int = 24, p: float = 0.0, **names: str) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(d, h), nn.Linear(d, h), nn.Linear(h, d)
        self.gate_up_proj = nn.Linear(d, 2 * h)
        self.act_fn = nn.SiLU()
        self.dropout = nn.Dropout(p)
        self.residual_dropout = p
        self.limit = 7.0


class Llama(_Base):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Locals(_Base):
    def forward(self, hidden_states):
        """The input's name reused, factors swapped, a dropout between."""
        up = self.up_proj(hidden_states)
        hidden_states = self.act_fn(self.gate_proj(hidden_states))
        hidden_states = up * hidden_states
        hidden_states = self.dropout(hidden_states)
        return self.down_proj(hidden_states)


class FunctionalDropout(_Base):
    def forward(self, x):
        y = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return F.dropout(y, self.residual_dropout, training=self.training)


class CastToWeight(_Base):
    def forward(self, hidden_states):
        hidden_gelu = self.act_fn(self.gate_proj(hidden_states))
        hidden_linear = self.up_proj(hidden_states)
        hidden_states = hidden_gelu * hidden_linear
        hidden_states = self.dropout(hidden_states)
        if (
            isinstance(self.down_proj.weight, torch.Tensor)
            and hidden_states.dtype != self.down_proj.weight.dtype
            and self.down_proj.weight.dtype != torch.int8
        ):
            hidden_states = hidden_states.to(self.down_proj.weight.dtype)
        return self.down_proj(hidden_states)


class GateUp(_Base):
    def forward(self, hidden_states):
        """Phi-3's: one projection chunked, the gate's half first."""
        up_states = self.gate_up_proj(hidden_states)
        gate, up_states = up_states.chunk(2, dim=-1)
        up_states = up_states * self.act_fn(gate)
        return self.down_proj(up_states)


class UpGate(_Base):
    def forward(self, x):
        """The gate's half second, through torch.chunk and indexing (Granite's), a dropout between."""
        halves = torch.chunk(self.gate_up_proj(x), 2, dim=-1)
        return self.down_proj(self.dropout(halves[0] * self.act_fn(halves[1])))


class WholeChunk(_Base):
    def forward(self, x):
        halves = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(halves[0]) * halves[1]) + halves[0].sum()


class SameHalf(_Base):
    def forward(self, x):
        a, b = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(a) * a)


class ThreeChunks(_Base):
    def forward(self, x):
        a, b = self.gate_up_proj(x).chunk(3, dim=-1)
        return self.down_proj(self.act_fn(a) * b)


class Clamped(_Base):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)).clamp(max=self.limit) * self.up_proj(x))


class Scaled(_Base):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)) * self.limit


class KeptProduct(_Base):
    def forward(self, x):
        h = self.act_fn(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(h) + h.sum()


class UnusedLocal(_Base):
    def forward(self, x):
        g = self.gate_proj(x)  # noqa: F841 (computed, never used: not the form)
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class TwoInputs(_Base):
    def forward(self, x, y):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(y))


class InplaceDropout(_Base):
    def forward(self, x):
        y = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return F.dropout(y, p=self.residual_dropout, training=self.training, inplace=True)


class Branch(_Base):
    def forward(self, x):
        if x.shape[0] > 1:
            x = x * 2
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


TWO = ("gate_proj", "up_proj")


@pytest.mark.parametrize("cls,proj,chain,gate_first", [
    (Llama, TWO, (("module", "down_proj"),), True),
    (Locals, TWO, (("module", "dropout"), ("module", "down_proj")), True),
    (FunctionalDropout, TWO, (("module", "down_proj"), ("dropout", "residual_dropout")), True),
    (CastToWeight, TWO, (("module", "dropout"), ("cast", "down_proj"), ("module", "down_proj")), True),
    (GateUp, ("gate_up_proj",), (("module", "down_proj"),), True),
    (UpGate, ("gate_up_proj",), (("module", "dropout"), ("module", "down_proj")), False),
])
def test_gated_forms_read(cls, proj, chain, gate_first):
    assert gated_form(cls) == GatedForm(proj, "act_fn", chain, gate_first)


@pytest.mark.parametrize("cls", [Clamped, Scaled, KeptProduct, UnusedLocal, TwoInputs, InplaceDropout, Branch,
                                 WholeChunk, SameHalf, ThreeChunks])
def test_other_forwards_are_not_gated_forms(cls):
    assert gated_form(cls) is None
    assert not any(b.fusion.startswith("gated mlp") for b in xkernels.patch(cls()).blocks)


def _train_step(model: nn.Module, x: torch.Tensor, seed: int):
    """Output and every gradient of one training step, the dropout draws seeded."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    y = model(x)
    y.square().sum().backward()
    return y.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("cls", [Llama, Locals, FunctionalDropout, CastToWeight, GateUp, UpGate])
def test_fused_forward_runs_the_forms_tail(backend, device, cls):
    """Dropout (p=0.3, training): the fused forward applies the same dropouts to the same tensors
    with the same generator, so the masks, outputs and gradients are the module's own."""
    torch.manual_seed(0)
    model = cls(p=0.3).to(device).train()
    fused = copy.deepcopy(model)
    report = xkernels.patch(fused)
    assert [b.fusion for b in report.blocks] == ["gated mlp (gate_up)" if cls in (GateUp, UpGate) else "gated mlp"]
    x = torch.randn(3, 5, 16, device=device, requires_grad=True)
    for seed in (1, 2):
        want, want_grads = _train_step(model, x, seed)
        got, got_grads = _train_step(fused, x, seed)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    fused.eval()
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model.eval()(x), rtol=1e-4, atol=1e-5)


def test_an_activation_the_op_does_not_take_is_left_with_its_reason(device):
    """A gated form whose activation module the op has no kernel for (here Softplus) keeps its own
    forward and is reported as left, naming the activation."""
    model = Llama().to(device)
    model.act_fn = nn.Softplus()
    x = torch.randn(2, 16, device=device)
    want = model(x)
    report = xkernels.patch(model)
    assert not report.blocks, report
    assert [(m.name, m.kind, m.reason) for m in report.left] == [
        ("(root)", "Llama",
         "gated mlp not fused: act_fn (Softplus) is not an activation xkernels.ops.gated_linear takes")], report
    torch.testing.assert_close(model(x), want)


def test_an_activation_swapped_after_patch_is_the_one_used(backend, device):
    """The fused step was set up for the activation patch() saw: another activation module put in
    its slot later (or an nn.GELU whose approximation changed) makes the class's own forward run,
    with it, in training and inference."""
    torch.manual_seed(0)
    model = Llama().to(device)
    model.act_fn = nn.GELU()
    fused = copy.deepcopy(model)
    assert [b.fusion for b in xkernels.patch(fused).blocks] == ["gated mlp"]
    x = torch.randn(3, 5, 16, device=device, requires_grad=True)
    for act in (nn.SiLU(), nn.GELU(approximate="tanh")):
        model.act_fn, fused.act_fn = act, copy.deepcopy(act)
        want, want_grads = _train_step(model, x, 1)
        got, got_grads = _train_step(fused, x, 1)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            torch.testing.assert_close(fused(x), model(x), rtol=1e-4, atol=1e-5)


def test_cast_to_a_float64_down_projection(backend, device):
    """T5's cast: a down-projection kept in another dtype gets the product cast to it."""
    torch.manual_seed(0)
    model = CastToWeight().to(device)
    model.down_proj.double()
    fused = copy.deepcopy(model)
    xkernels.patch(fused)
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        want, got = model(x), fused(x)
    assert got.dtype == want.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


#: transformers families whose MLP is one of these forms: (config, model, arguments, the MLP's class)
FAMILIES = {
    "t5": ("T5Config", "T5Model", dict(d_model=32, d_ff=48, num_layers=1, num_heads=4, d_kv=8, vocab_size=64,
                                       feed_forward_proj="gated-gelu", dropout_rate=0.2), "T5DenseGatedActDense"),
    "umt5": ("UMT5Config", "UMT5Model", dict(d_model=32, d_ff=48, num_layers=1, num_heads=4, d_kv=8, vocab_size=64,
                                             feed_forward_proj="gated-gelu", dropout_rate=0.2),
             "UMT5DenseGatedActDense"),
    "gte": ("GteConfig", "GteModel", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                          num_attention_heads=4, vocab_size=64, max_position_embeddings=64,
                                          hidden_dropout_prob=0.2), "GteMLP"),
    "modernbert": ("ModernBertConfig", "ModernBertModel", dict(hidden_size=32, intermediate_size=48,
                                                               num_hidden_layers=1, num_attention_heads=4,
                                                               vocab_size=64, pad_token_id=0, bos_token_id=1,
                                                               eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                                               mlp_dropout=0.2), "ModernBertMLP"),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", dict(hidden_size=32, intermediate_size=48,
                                                             num_hidden_layers=1, num_attention_heads=4,
                                                             num_key_value_heads=2, vocab_size=64,
                                                             residual_dropout=0.2, attention_dropout=0.0),
                 "SeedOssMLP"),
}


#: families whose gated MLP takes an activation other than SiLU / GELU: (config, model, arguments,
#: the MLP's class, the activation gated_linear is called with)
ACTIVATION_FAMILIES = {
    # BitNet: relu(gate)^2 * up, then a norm before the down-projection
    "bitnet": ("BitNetConfig", "BitNetForCausalLM", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                                         bos_token_id=1, eos_token_id=2), "BitNetMLP", "relu2"),
    "llama, quick_gelu": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=32, intermediate_size=48,
                                                                  num_hidden_layers=1, num_attention_heads=4,
                                                                  num_key_value_heads=2, vocab_size=64,
                                                                  hidden_act="quick_gelu"), "LlamaMLP", "quick_gelu"),
}


@pytest.mark.parametrize("family", list(ACTIVATION_FAMILIES))
def test_families_with_other_gate_activations_train_fused(backend, device, family):
    """BitNet's squared ReLU and a QuickGELU gate are fused like SwiGLU: each MLP's product is
    one ``gated_linear`` call with that activation, and a training step gives the unpatched model's
    output and gradients."""
    from xkernels.block_steps import GatedStep

    cfg_name, model_name, kwargs, mlp, activation = ACTIVATION_FAMILIES[family]
    fused = _assert_family_trains_fused(device, family, cfg_name, model_name, kwargs, mlp)
    steps = [m._xkernels_block for m in fused.modules() if isinstance(getattr(m, "_xkernels_block", None), GatedStep)]
    assert steps and {s.activation for s in steps} == {activation}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_families_with_dropout_train_fused(backend, device, family):
    """Each family's MLPs are fused, and a training step with its dropout on gives the unpatched
    model's output and gradients (same seed, same masks)."""
    _assert_family_trains_fused(device, family, *FAMILIES[family])


def _assert_family_trains_fused(device, family, cfg_name, model_name, kwargs, mlp):
    model, inputs = tiny_model(cfg_name, model_name, kwargs, device)
    fused = copy.deepcopy(model)
    report = xkernels.patch(fused)
    gated = [b for b in report.blocks if b.fusion.startswith("gated mlp")]
    assert gated and all(b.kind == mlp for b in gated), str(report)

    def step(m):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(2)
        out = m(**inputs)
        y = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
        y.square().mean().backward()
        return y.detach(), [(n, p.grad) for n, p in m.named_parameters() if p.grad is not None]

    want, want_grads = step(model)
    got, got_grads = step(fused)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert [n for n, _ in got_grads] == [n for n, _ in want_grads]
    for (name, g), (_, w) in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4, msg=lambda m, name=name: f"{family} {name}: {m}")
    return fused
