"""``xkernels.patch(model)``: linear layers swapped for xkernels modules, activations fused where
the model's structure says so, parameters shared, and a report of what was replaced and left."""

from __future__ import annotations

import copy

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_model_close, require_transformers
from xkernels.nn import linear_activations


def _mlp() -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(),
        torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 32), torch.nn.LeakyReLU(0.2),
        torch.nn.Linear(32, 24), torch.nn.SiLU(),
        torch.nn.Linear(24, 24), torch.nn.Tanh(),
        torch.nn.Linear(24, 16, bias=False), torch.nn.Dropout(0.0),
        torch.nn.Linear(16, 8), torch.nn.GELU(approximate="tanh"),
    )


def _forward_three_ways(model: torch.nn.Module, x: torch.Tensor, **kw):
    """(patched model's output, the unpatched model's output, the unpatched model in float64)."""
    model64 = copy.deepcopy(model).double()
    want = model(x, **kw)
    ref64 = model64(x.double() if x.is_floating_point() else x, **kw)
    report = xkernels.patch(model)
    return report, want, ref64


def test_sequential_mlp(backend, device):
    model = _mlp().to(device).eval()
    keys, params = list(model.state_dict()), [id(p) for p in model.parameters()]
    x = torch.randn(4, 16, device=device)
    report, want, ref64 = _forward_three_ways(model, x)
    with torch.no_grad(), Unchanged(x, *model.parameters()):
        got = model(x)
    assert_model_close(got, want.detach(), ref64.detach())
    assert list(model.state_dict()) == keys, "state_dict keys changed"
    assert [id(p) for p in model.parameters()] == params, "parameters were copied"

    fused = {r.name: (r.activation, r.activation_module) for r in report.fused}
    tanh_fused = "gelu_tanh" in linear_activations()
    assert fused == {"0": ("gelu", "1"), "2": ("relu", "3"), "4": ("leaky_relu", "5"), "6": ("silu", "7"),
                     **({"12": ("gelu_tanh", "13")} if tanh_fused else {})}
    assert model[4].negative_slope == 0.2 and isinstance(model[5], torch.nn.Identity)
    assert {r.name for r in report.replaced} == {"0", "2", "4", "6", "8", "10", "12"}
    assert all(type(model[int(r.name)]) is xkernels.nn.Linear for r in report.replaced)
    left = {m.name: m.reason for m in report.left}
    assert left["9"] == "Tanh is not an activation xkernels.ops.linear fuses; the layer is swapped unfused"
    assert ("13" in left) is not tanh_fused  # Dropout (11) is no activation: not reported
    assert set(left) <= {"9", "13"}
    text = str(report)
    assert text.startswith(f"xkernels.patch: 0 blocks fused, 7 layers replaced ({len(fused)} with a fused activation), "
                           f"{len(left)} left")
    assert "replaced 0 (Linear) + 1 fused as 'gelu' -> xkernels.nn.Linear(in_features=16, out_features=32" in text

    again = xkernels.patch(model)  # idempotent: everything is an xkernels module already
    assert again.replaced == [] and {m.reason for m in again.left} == {"already an xkernels module"}

    again.undo()  # nothing to put back
    report.undo()  # the model's own modules, in their slots, with the same parameters
    assert [type(m) for m in model] == [type(m) for m in _mlp()]
    assert model[5].negative_slope == 0.2 and [id(p) for p in model.parameters()] == params
    with torch.no_grad():
        torch.testing.assert_close(model(x), want.detach(), rtol=0, atol=0)
    report.undo()
    assert [type(m) for m in model] == [type(m) for m in _mlp()]


def test_left_modules_are_reported():
    class MyLinear(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), MyLinear(4, 4), torch.nn.Linear(4, 4))
    model[3].register_forward_hook(lambda *a: None)
    report = xkernels.patch(model)
    assert [r.name for r in report.replaced] == ["0"]
    assert {m.name: m.reason for m in report.left} == {
        "2": "a subclass of Linear: its forward or its users may differ",
        "3": "has hooks; the replacement would not run them",
    }
    root = xkernels.patch(torch.nn.Linear(3, 3))
    assert root.replaced == [] and root.left[0].name == "(root)"
    with pytest.raises(TypeError, match="'model' must be a torch.nn.Module"):
        xkernels.patch(lambda x: x)


def test_optimizer_built_before_patch_keeps_training_the_model(device):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xkernels.patch(model)
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}


def _tiny_bert(transformers):
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg).eval()


def _tiny_gpt2(transformers):
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0,
                                  eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2Model(cfg).eval()


def test_tiny_bert(backend, device):
    model = _tiny_bert(require_transformers()).to(device)
    keys = list(model.state_dict())
    ids = torch.randint(0, 64, (2, 6), device=device)
    report, want, ref64 = _forward_three_ways(model, ids)
    with torch.no_grad():
        got = model(ids).last_hidden_state
    assert_model_close(got, want.last_hidden_state.detach(), ref64.last_hidden_state.detach())
    assert list(model.state_dict()) == keys
    assert {(r.name, r.activation, r.activation_module) for r in report.fused} == {
        (f"encoder.layer.{i}.intermediate.dense", "gelu", f"encoder.layer.{i}.intermediate.intermediate_act_fn")
        for i in range(2)}
    assert len(report.replaced) == 2 * 6 + 1 and report.left == []  # q, k, v, out, up, down per layer + pooler
    assert report.counts() == {"linear + activation": 2, "linear": 11, "residual add + norm (output block)": 4,
                               "feed-forward (training)": 2, "residual add + norm (post-norm)": 1,  # the embeddings
                               "attention mask by rows": 2,  # the self-attention modules' config proxy
                               "attention masks decided as in eager mode": 1}  # BertModel's mask creation
    assert type(model.encoder.layer[0].attention.self.query) is xkernels.nn.Linear
    report.undo()
    assert all(type(m) is not xkernels.nn.Linear for m in model.modules())
    assert type(model.encoder.layer[1].intermediate.intermediate_act_fn).__name__ == "GELUActivation"


def test_tiny_gpt2(backend, device):
    model = _tiny_gpt2(require_transformers()).to(device)
    keys = list(model.state_dict())
    ids = torch.randint(0, 64, (2, 6), device=device)
    report, want, ref64 = _forward_three_ways(model, ids)
    with torch.no_grad():
        got = model(ids).last_hidden_state
    assert_model_close(got, want.last_hidden_state.detach(), ref64.last_hidden_state.detach())
    assert list(model.state_dict()) == keys
    assert len(report.replaced) == 2 * 4 and all(r.old == "Conv1D" for r in report.replaced)
    assert type(model.h[0].attn.c_attn) is xkernels.nn.Conv1D
    if "gelu_tanh" in linear_activations():
        assert {(r.name, r.activation) for r in report.fused} == {(f"h.{i}.mlp.c_fc", "gelu_tanh") for i in range(2)}
        assert report.left == []
    else:
        assert report.fused == [] and [m.name for m in report.left] == ["h.0.mlp.act", "h.1.mlp.act"]
