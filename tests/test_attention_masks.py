"""``patch()``'s attention-mask pre-hook (``xkernels/attention_masks.py``): a mask broadcast along
the keys reaches the attention call as a dense copy of the same values; every other mask, and the
outputs and gradients, are the unpatched model's."""

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


def test_targets_are_the_modules_passing_their_mask_to_an_attention_call():
    tf = require_transformers()
    bert = _bert()
    found = {name: position for name, _, position in attention_masks.targets(bert)}
    assert found == {f"encoder.layer.{i}.attention.self": 1 for i in range(2)}
    # causal attention builds its masks from the positions: no hook
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64)
    assert attention_masks.targets(tf.LlamaModel(cfg)) == []
    assert attention_masks.targets(torch.nn.Sequential(torch.nn.Linear(4, 4))) == []


def test_dense_mask_copies_only_a_mask_broadcast_along_the_keys():
    m = _broadcast_mask(2, 8)
    dense = attention_masks.dense_mask(m)
    assert dense.stride(-1) == 1 and torch.equal(dense, m) and m.stride(-1) == 0
    padded = torch.ones(2, 8, dtype=torch.bool)[:, None, None, :].expand(2, 1, 8, 8)  # depends on the key
    for other in (padded, torch.ones(2, 1, 8, 1, dtype=torch.bool), None, 3.0, torch.tensor(True).expand(8)):
        assert attention_masks.dense_mask(other) is other


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_patched_bert_gets_a_dense_mask_and_computes_the_same(attn, sdpa_masks, device):
    """On any backend: the patched model's other fusions run its kernels, and on cuda SDPA takes a
    fused kernel for the dense mask where the unpatched model's mask took the math path."""
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (3, 8), device=device)
    mask = _broadcast_mask(3, 8, device=device)
    model = _bert(attn, device)
    patched = copy.deepcopy(model)
    report = xkernels.patch(patched)
    assert report.counts()[attention_masks.FUSION] == 2
    assert attention_masks.FUSION in str(report)
    ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert all(m is mask or m is None for m in sdpa_masks)  # the unpatched model's mask as it came
    sdpa_masks.clear()
    out = patched(input_ids=ids, attention_mask=mask).last_hidden_state
    if attn == "sdpa":
        assert len(sdpa_masks) == 2 and all(m.stride(-1) == 1 and torch.equal(m, mask) for m in sdpa_masks)
    assert mask.stride() == (0, 8, 1, 0)  # the caller's mask is not changed
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_training_gradients_and_masked_rows_are_the_unpatched_models(device):
    """Rows masked whole (a mask constant along the keys may have them): the fused kernels' zero
    rows, as the math path's, and the same gradients."""
    torch.manual_seed(2)
    ids = torch.randint(0, 64, (2, 8), device=device)
    mask = _broadcast_mask(2, 8, device=device).clone()
    mask[1, :, 5:] = False  # rows masked whole: still constant along the keys
    mask = mask[:, :, :, :1].expand(2, 1, 8, 8)
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
    assert outs[1].isfinite().all()
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)


def test_positional_and_keyword_masks_are_both_made_dense(sdpa_masks):
    attn = _bert().encoder.layer[0].attention.self
    (_, module, position), *_ = attention_masks.targets(attn)
    handle = attention_masks.apply(module, position)
    x = torch.randn(2, 8, 32)
    mask = _broadcast_mask(2, 8)
    a = attn(x, mask)[0]
    b = attn(x, attention_mask=mask)[0]
    assert len(sdpa_masks) == 2 and all(m.stride(-1) == 1 for m in sdpa_masks)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    handle.remove()
    sdpa_masks.clear()
    attn(x, mask)
    assert sdpa_masks == [mask]


def test_undo_twice_patched_copies_and_saved_models(sdpa_masks):
    model = _bert()
    report = xkernels.patch(model)
    again = xkernels.patch(model)  # the hook is not added twice
    assert attention_masks.FUSION not in again.counts()
    target = model.encoder.layer[0].attention.self
    assert len(target._forward_pre_hooks) == 1
    ids, mask = torch.randint(0, 64, (2, 8)), _broadcast_mask(2, 8)
    copied = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for m in (copied, loaded):
        sdpa_masks.clear()
        m(input_ids=ids, attention_mask=mask)
        assert sdpa_masks and all(s.stride(-1) == 1 for s in sdpa_masks)
    report.undo()
    assert not target._forward_pre_hooks
    sdpa_masks.clear()
    model(input_ids=ids, attention_mask=mask)
    assert all(s is mask for s in sdpa_masks)


def test_compiled_patched_bert_traces_the_dense_mask():
    """Dynamo traces the hook: the graph copies the mask before the attention call (no graph break)."""
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
    calls = [n for n in graphs[0].graph.nodes if n.target is F.scaled_dot_product_attention
             or "scaled_dot_product_attention" in str(n.target)]
    assert len(calls) == 2
    for call in calls:
        arg = call.kwargs.get("attn_mask", call.args[3] if len(call.args) > 3 else None)
        assert arg is not None and arg.meta["example_value"].stride(-1) == 1
    torch.testing.assert_close(out.last_hidden_state, model(input_ids=ids, attention_mask=mask).last_hidden_state,
                               rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_computes_the_same_for_the_dense_copy_rows_masked_whole_included(dtype, device):
    """What the hook relies on: SDPA gives the same values for the dense copy (on cuda a fused
    kernel: cuDNN for bf16, memory-efficient for fp32) as for the broadcast mask (its math path),
    rows masked whole included (zeros, not NaN), gradients too."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 3, 64, 32, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    rows = torch.ones(2, 1, 64, 1, dtype=torch.bool, device=device)
    rows[1, :, 40:] = False
    broadcast = rows.expand(2, 1, 64, 64)
    outs, grads = [], []
    for mask in (broadcast, attention_masks.dense_mask(broadcast)):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        grads.append(torch.autograd.grad(out.float().square().sum(), (q, k, v)))
        outs.append(out.detach())
    assert outs[1].isfinite().all() and not outs[1][1, :, 40:].any()
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outs[1], outs[0], **tol)
    for got, want in zip(grads[1], grads[0]):
        assert got.isfinite().all()
        torch.testing.assert_close(got, want, **tol)
