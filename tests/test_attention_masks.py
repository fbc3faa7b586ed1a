"""``patch()``'s attention masks (``xkernels/attention_masks.py``): a boolean mask with one value per
query row runs as no mask with its masked rows zeroed; every other mask goes to transformers' own
function, and the outputs and gradients are the unpatched model's."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F

import xkernels
from helpers import require_transformers
from xkernels import attention_masks


def _bert(attn: str = "sdpa", device: torch.device | str = "cpu") -> torch.nn.Module:
    tf = require_transformers()
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=64, max_position_embeddings=32, attn_implementation=attn,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return tf.BertModel(cfg).to(device).eval()


def _broadcast_mask(batch: int, seq: int, keep_rows: bool = True, device: torch.device | str = "cpu") -> torch.Tensor:
    """transformers' all-true bidirectional mask as it builds it while dynamo traces (torch < 2.14):
    (batch, 1, seq, seq) bool, stride 0 along the batch and the keys."""
    return torch.full((1, 1, seq, 1), keep_rows, dtype=torch.bool, device=device).expand(batch, 1, seq, seq)


@pytest.fixture
def sdpa_masks(monkeypatch) -> list[torch.Tensor | None]:
    """The ``attn_mask`` of every ``F.scaled_dot_product_attention`` call, in order."""
    seen: list[torch.Tensor | None] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


def test_targets_are_the_modules_passing_their_mask_to_the_attention_interface():
    tf = require_transformers()
    bert = _bert()
    assert [name for name, _ in attention_masks.targets(bert)] == [f"encoder.layer.{i}.attention.self" for i in range(2)]
    # causal attention builds its masks from the positions: not a target
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64)
    assert attention_masks.targets(tf.LlamaModel(cfg)) == []
    assert attention_masks.targets(torch.nn.Sequential(torch.nn.Linear(4, 4))) == []


def test_rows_of_takes_only_a_boolean_mask_constant_along_the_keys():
    m = _broadcast_mask(2, 8)
    rows = attention_masks.rows_of(m)
    assert rows.shape == (2, 1, 8, 1) and rows.all()
    padded = torch.ones(2, 8, dtype=torch.bool)[:, None, None, :].expand(2, 1, 8, 8)  # differs along the keys
    additive = torch.zeros(1, 1, 8, 1).expand(2, 1, 8, 8)  # a float mask: its rows are not all-or-nothing
    for other in (padded, additive, torch.ones(2, 1, 8, 1, dtype=torch.bool), None, m[0, 0], torch.ones(2, 1, 8, 8) > 0):
        assert attention_masks.rows_of(other) is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_patched_bert_runs_the_unmasked_attention_and_computes_the_same(attn, sdpa_masks, device):
    """On any backend: the patched model's other fusions run its kernels, and on cuda SDPA runs a
    fused kernel where the unpatched model's mask took the math path. Under 'eager' the model's
    own attention runs."""
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (3, 8), device=device)
    mask = _broadcast_mask(3, 8, device=device)
    model = _bert(attn, device)
    patched = copy.deepcopy(model)
    report = xkernels.patch(patched)
    assert report.counts()[attention_masks.FUSION] == 2
    assert attention_masks.FUSION in str(report)
    ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert all(m is mask for m in sdpa_masks)  # the unpatched model's mask as it came
    sdpa_masks.clear()
    out = patched(input_ids=ids, attention_mask=mask).last_hidden_state
    assert sdpa_masks == ([None, None] if attn == "sdpa" else [])
    assert patched.config._attn_implementation == attn  # the model's own config is untouched
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_training_with_rows_masked_whole_matches_the_unpatched_model(device, sdpa_masks):
    """Rows masked whole (a mask constant along the keys may have them): zeros, as the math path's,
    and the same gradients."""
    torch.manual_seed(2)
    ids = torch.randint(0, 64, (2, 8), device=device)
    rows = torch.ones(2, 1, 8, 1, dtype=torch.bool, device=device)
    rows[1, :, 5:] = False
    mask = rows.expand(2, 1, 8, 8)
    model = _bert(device=device).train()
    patched = copy.deepcopy(model)
    xkernels.patch(patched)
    grads, outs = [], []
    for m in (model, patched):
        m.zero_grad(set_to_none=True)
        out = m(input_ids=ids, attention_mask=mask).last_hidden_state
        out.float().square().mean().backward()
        outs.append(out.detach())
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert sdpa_masks[-2:] == [None, None]
    assert outs[1].isfinite().all()
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_by_rows_is_transformers_sdpa_of_the_mask(dtype, device):
    """:func:`attention` against transformers' ``sdpa`` function given the broadcast mask (PyTorch's
    math path), rows masked whole included (zeros, not NaN), gradients too; another mask passes
    through unchanged."""
    require_transformers()
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(3)
    module = torch.nn.Module()
    module.is_causal = True  # dropping the mask must not make the call causal
    q, k, v = (torch.randn(2, 3, 64, 32, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    rows = torch.ones(2, 1, 64, 1, dtype=torch.bool, device=device)
    rows[1, :, 40:] = False
    mask = rows.expand(2, 1, 64, 64)
    outs, grads = [], []
    for fn in (sdpa_attention_forward, attention_masks.attention):
        out = fn(module, q, k, v, mask, scaling=0.25)[0]
        grads.append(torch.autograd.grad(out.float().square().sum(), (q, k, v)))
        outs.append(out.detach())
    assert outs[1].shape == (2, 64, 3, 32) and outs[1].isfinite().all() and not outs[1][1, 40:].any()
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outs[1], outs[0], **tol)
    for got, want in zip(grads[1], grads[0]):
        assert got.isfinite().all()
        torch.testing.assert_close(got, want, **tol)
    by_position = attention_masks.attention(module, q, k, v, mask, 0.0, 0.25, True)[0]  # is_causal by position
    torch.testing.assert_close(by_position, outs[1])
    padded = torch.ones(2, 1, 64, 64, dtype=torch.bool, device=device)
    padded[0, :, :, 50:] = False
    torch.testing.assert_close(attention_masks.attention(module, q, k, v, padded)[0],
                               sdpa_attention_forward(module, q, k, v, padded)[0], rtol=0, atol=0)


def test_positional_and_keyword_masks_both_run_by_rows(sdpa_masks):
    bert = _bert()
    xkernels.patch(bert)
    attn = bert.encoder.layer[0].attention.self
    x = torch.randn(2, 8, 32)
    mask = _broadcast_mask(2, 8)
    a = attn(x, mask)[0]
    b = attn(x, attention_mask=mask)[0]
    assert sdpa_masks == [None, None]
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_undo_twice_patched_copies_saved_models_and_a_later_implementation(sdpa_masks):
    model = _bert()
    report = xkernels.patch(model)
    again = xkernels.patch(model)  # not proxied twice
    assert attention_masks.FUSION not in again.counts()
    target = model.encoder.layer[0].attention.self
    assert isinstance(target.config, attention_masks.AttentionConfig) and target.config._xkernels_config is model.config
    assert target.config.hidden_size == 32 and target.config._attn_implementation == attention_masks.NAME
    # what Python asks the type: answered as the config answers
    assert target.config == model.config
    assert model.config == target.config and target.config != model.config.to_dict()
    assert list(target.config) == list(model.config) and "hidden_size" in target.config
    with pytest.raises(TypeError):
        hash(target.config)
    model.config.__deepcopy__ = lambda memo: None  # a config's copy protocol is not the proxy's
    assert not hasattr(target.config, "__deepcopy__")
    del model.config.__deepcopy__
    ids, mask = torch.randint(0, 64, (2, 8)), _broadcast_mask(2, 8)
    copied = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for m in (copied, loaded):
        assert m.encoder.layer[1].attention.self.config._xkernels_config is m.config  # the copy's own config
        sdpa_masks.clear()
        m(input_ids=ids, attention_mask=mask)
        assert sdpa_masks == [None, None]
    model.set_attn_implementation("eager")  # reaches the proxied modules: their mask goes to eager attention
    assert target.config._attn_implementation == "eager"
    model.set_attn_implementation("sdpa")
    report.undo()
    assert target.config is model.config
    sdpa_masks.clear()
    model(input_ids=ids, attention_mask=mask)
    assert all(s is mask for s in sdpa_masks) and len(sdpa_masks) == 2


def test_compiled_patched_bert_traces_the_unmasked_attention():
    """Dynamo traces the proxy and the function: one graph, SDPA without a mask."""
    model = _bert()
    patched = copy.deepcopy(model)
    xkernels.patch(patched)
    ids, mask = torch.randint(0, 64, (2, 8)), _broadcast_mask(2, 8)
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(patched, backend=backend, fullgraph=True)(input_ids=ids, attention_mask=mask)
    torch._dynamo.reset()
    assert len(graphs) == 1
    calls = [n for n in graphs[0].graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    assert len(calls) == 2
    for call in calls:
        assert call.kwargs.get("attn_mask", call.args[3] if len(call.args) > 3 else None) is None
    torch.testing.assert_close(out.last_hidden_state, model(input_ids=ids, attention_mask=mask).last_hidden_state,
                               rtol=1e-5, atol=1e-6)
