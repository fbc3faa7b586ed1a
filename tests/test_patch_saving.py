"""Saving and copying patched models (xkernels/patch_saving.py): ``torch.save`` / ``torch.load`` of a
whole patched model (or one patched submodule) and ``copy.deepcopy`` give a model patched as the
original was, that computes exactly what it computes, gradients included, with records of its own;
a module whose class no longer takes its fusion when the file loads runs its own forward, with a
warning; after ``undo()`` the file holds no xkernels object at all. ``nn.DataParallel``'s replicas
of a patched model run their fused forwards on their own parameters."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import xkernels
from helpers import assert_model_close, require_transformers
from xkernels import attention_masks, blocks, mask_decisions, patch_saving
from xkernels.block_steps import FeedForwardStep

LM = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          vocab_size=64, max_position_embeddings=64)
#: family -> (config class, model class, config arguments): block, gated, feed-forward and rotary fusions
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", LM),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(LM, pad_token_id=0, partial_rotary_factor=0.5)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64)),
    "bert": ("BertConfig", "BertForMaskedLM", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                   num_attention_heads=4, vocab_size=64,
                                                   max_position_embeddings=64)),
}


def _build(family, device):
    tf = require_transformers()
    cfg_name, model_name, kwargs = FAMILIES[family]
    cfg = getattr(tf, cfg_name)(**kwargs)
    cfg._attn_implementation = "eager"
    for attr in ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(cfg, attr):
            setattr(cfg, attr, 0.0)
    torch.manual_seed(0)
    return getattr(tf, model_name)(cfg).to(device).train()


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    y = model(ids).logits
    y.double().square().mean().backward()
    return y.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _saved_and_loaded(module):
    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False), buf.getvalue()


def _assert_same(got, want):
    (y, grads), (y0, grads0) = got, want
    assert torch.equal(y, y0)
    assert grads.keys() == grads0.keys()
    for n in grads:
        assert torch.equal(grads[n], grads0[n]), n


@pytest.mark.parametrize("way", ["torch.save", "deepcopy"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_saved_patched_model_loads_patched(backend, device, family, way):
    model = _build(family, device)
    report = xkernels.patch(model)
    made = patch_saving.fused(model)
    # a config proxy and hooks, not forwards
    forwards = [b for b in report.blocks if b.fusion not in (attention_masks.FUSION, mask_decisions.FUSION)]
    assert made and len(made) == len(forwards), (made, report)
    ids = torch.randint(3, 64, (2, 7), device=device)
    want = _step(model, ids)  # also fills the original's route caches
    twin = _saved_and_loaded(model)[0] if way == "torch.save" else copy.deepcopy(model)
    assert patch_saving.fused(twin) == made
    for name, module in twin.named_modules():
        original = model.get_submodule(name)
        assert module.__dict__.keys() == original.__dict__.keys(), name
        record = module.__dict__.get("_xkernels_block")
        if record is not None and not isinstance(record, FeedForwardStep):  # (that one is the fusion's constant)
            assert record is not original.__dict__["_xkernels_block"], name  # rebuilt, not shared
    _assert_same(_step(twin, ids), want)
    _assert_same(_step(model, ids), want)  # the original is untouched by the save


def test_a_saved_patched_submodule_loads_patched(backend, device):
    model = _build("llama", device)
    xkernels.patch(model)
    layer = model.model.layers[0]
    loaded = _saved_and_loaded(layer)[0]
    prefix = "model.layers.0"
    want = {k.removeprefix(prefix).removeprefix(".") or "(root)": v for k, v in patch_saving.fused(model).items()
            if k == prefix or k.startswith(prefix + ".")}
    assert patch_saving.fused(loaded) == want and len(want) > 2, want
    h = torch.randn(2, 7, 32, device=device)
    pos = model.model.rotary_emb(h, torch.arange(7, device=device)[None])
    with torch.no_grad():
        assert torch.equal(loaded(h, position_embeddings=pos), layer(h, position_embeddings=pos))


def test_a_class_that_no_longer_matches_loads_unfused_with_a_warning(backend, device, monkeypatch):
    model = _build("llama", device)
    ids = torch.randint(3, 64, (2, 7), device=device)
    ref64 = copy.deepcopy(model).double()
    want = _step(model, ids)[0]
    xkernels.patch(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    matching = blocks.matching
    monkeypatch.setattr(blocks, "matching",  # as if another transformers changed LlamaMLP's forward
                        lambda m: None if type(m).__name__ == "LlamaMLP" else matching(m))
    with pytest.warns(UserWarning, match=r"LlamaMLP saved patched \('gated mlp'\) runs its own forward"):
        loaded = torch.load(buf, weights_only=False)
    fused = patch_saving.fused(loaded)
    assert not any(k.endswith(".mlp") for k in fused) and any(k.endswith(".self_attn") for k in fused), fused
    for layer in loaded.model.layers:
        assert "forward" not in layer.mlp.__dict__ and "_xkernels_block" not in layer.mlp.__dict__
    assert_model_close(_step(loaded, ids)[0], want, _step(ref64, ids)[0])


def test_after_undo_the_file_needs_no_xkernels(backend, device):
    model = _build("llama", device)
    report = xkernels.patch(model)
    assert b"xkernels" in _saved_and_loaded(model)[1]
    report.undo()
    loaded, data = _saved_and_loaded(model)
    assert b"xkernels" not in data
    assert patch_saving.fused(loaded) == {}
    assert all("__reduce_ex__" not in m.__dict__ for m in model.modules())


def _replica(model, scale):
    """What ``torch.nn.parallel.replicate`` makes of ``model`` for one device, on this one: each
    module's ``_replicate_for_data_parallel()``, its children the replicas, its parameters set as
    plain tensors computed from the originals (here ``scale`` times them: a forward bound to the
    original would show)."""
    modules = list(model.modules())
    copies = {id(m): m._replicate_for_data_parallel() for m in modules}
    for m in modules:
        r = copies[id(m)]
        for key, child in m._modules.items():
            if child is not None:
                setattr(r, key, copies[id(child)])
        for key, p in m._parameters.items():
            if p is None:
                r._parameters[key] = None
            else:
                setattr(r, key, p * scale)
        for key, b in m._buffers.items():
            if b is not None:
                r._buffers[key] = b.clone()
    return copies[id(model)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_data_parallel_replicas_run_fused_on_their_own_parameters(backend, device, family):
    model = _build(family, device)
    xkernels.patch(model)
    twin = copy.deepcopy(model)  # patched too: the same kernels, so the same bits
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(2.0)
    ids = torch.randint(3, 64, (2, 7), device=device)
    want = _step(twin, ids)
    replica = _replica(model, 2.0)
    assert patch_saving.fused(replica) == patch_saving.fused(model)
    for name, module in replica.named_modules():
        for attr, value in module.__dict__.items():
            assert getattr(value, "__self__", module) is module, (name, attr)  # nothing bound to the original
    model.zero_grad(set_to_none=True)
    y = replica(ids).logits
    y.double().square().mean().backward()
    assert torch.equal(y.detach(), want[0])
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == want[1].keys()
    for n in grads:  # d/dp of f(2p) = 2 f'(2p), exactly
        assert torch.equal(grads[n], 2.0 * want[1][n]), n
