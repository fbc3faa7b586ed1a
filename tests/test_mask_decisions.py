"""``patch()``'s mask decisions (``xkernels/mask_decisions.py``): while dynamo traces, a patched
model-level module's masks are decided as in an eager call, so a compiled decoder's causal mask
without padding is SDPA's ``is_causal``; masks that eager mode builds are still built, and the
outputs and gradients are the unpatched model's."""

from __future__ import annotations

import copy
import inspect
import threading

import pytest
import torch

import xkernels
from helpers import require_transformers
from xkernels import mask_decisions


def _llama(device: torch.device | str = "cpu", **overrides) -> torch.nn.Module:
    tf = require_transformers()
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64, use_cache=False, attn_implementation="sdpa",
                         **overrides)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg).to(device).eval()


def _gpt2(device: torch.device | str = "cpu") -> torch.nn.Module:
    tf = require_transformers()
    cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, use_cache=False,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(cfg).to(device).eval()


def _traced_attention(model: torch.nn.Module, **inputs) -> tuple[torch.Tensor, list[tuple[bool, bool]]]:
    """The compiled call's logits (fullgraph, no Inductor) and, per SDPA call in its graph,
    (whether it was given a mask, whether it is causal)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        out = torch.compile(model, backend=backend, fullgraph=True)(**inputs)
    finally:
        torch._dynamo.reset()
    calls = [n for g in graphs for n in g.graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    seen = [((n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None)) is not None,
             bool(n.kwargs.get("is_causal", False))) for n in calls]
    return out.logits, seen


def test_targets_are_the_modules_creating_masks_with_their_position_index():
    tf = require_transformers()
    for model, name in ((_llama(), "model"), (_gpt2(), "transformer")):
        positions = list(inspect.signature(type(model.get_submodule(name)).forward).parameters).index("position_ids")
        assert [(n, i) for n, _, i in mask_decisions.targets(model)] == [(name, positions - 1)]  # after self
    bert = tf.BertModel(tf.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                      vocab_size=64))
    # BERT creates its masks in a helper method; its positions come from a buffer, not made as one sequence
    assert [(n, i) for n, _, i in mask_decisions.targets(bert)] == [("", None)]
    opt = tf.OPTModel(tf.OPTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ffn_dim=64,
                                   vocab_size=64, word_embed_proj_dim=32))
    # OPT makes its positions from the attention mask's cumulative sum: masks created, positions not one sequence
    assert [i for _, _, i in mask_decisions.targets(opt)] == [None]
    assert mask_decisions.targets(torch.nn.Sequential(torch.nn.Linear(4, 4))) == []


@pytest.mark.parametrize("use_cache", [False, True])
def test_compiled_patched_decoder_runs_causal_attention_and_computes_the_same(use_cache, device):
    """Without a cache the positions cannot be read while tracing; with one, dynamo on
    torch < 2.14 answers "exporting": either way transformers builds a mask for the unpatched
    model (the second only there)."""
    model = _llama(device)
    patched = copy.deepcopy(model)
    report = xkernels.patch(patched)
    assert report.counts()[mask_decisions.FUSION] == 1
    assert mask_decisions.FUSION in str(report)
    ids = torch.randint(0, 64, (2, 8), device=device)
    ref = model(input_ids=ids).logits
    _, unpatched = _traced_attention(model, input_ids=ids, use_cache=use_cache)
    out, seen = _traced_attention(patched, input_ids=ids, use_cache=use_cache)
    assert seen == [(False, True)] * 2
    if not use_cache or tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 12):
        assert unpatched == [(True, False)] * 2
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert not mask_decisions.decided_as_eager()


def test_compiled_patched_gpt2_runs_causal_attention():
    model = _gpt2()
    patched = copy.deepcopy(model)
    xkernels.patch(patched)
    ids = torch.randint(0, 64, (2, 8))
    out, seen = _traced_attention(patched, input_ids=ids)
    assert seen == [(False, True)] * 2
    torch.testing.assert_close(out, model(input_ids=ids).logits, rtol=1e-5, atol=1e-6)


def test_masks_eager_mode_builds_are_still_built():
    """Positions the caller passed (two packed sequences per row) and a padding mask: a mask, and
    the unpatched model's outputs."""
    model = _llama()
    patched = copy.deepcopy(model)
    xkernels.patch(patched)
    ids = torch.randint(0, 64, (2, 8))
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]] * 2)
    ref = model(input_ids=ids, position_ids=packed).logits
    assert (ref - model(input_ids=ids).logits).abs().max() > 1e-3  # the packing changes the result
    out, seen = _traced_attention(patched, input_ids=ids, position_ids=packed)
    assert seen == [(True, False)] * 2
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    padding = torch.ones(2, 8, dtype=torch.long)
    padding[1, :3] = 0
    ref = model(input_ids=ids, attention_mask=padding).logits
    out, seen = _traced_attention(patched, input_ids=ids, attention_mask=padding)
    assert seen == [(True, False)] * 2
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_compiled_training_gradients_match_the_unpatched_model():
    model = _llama().train()
    patched = copy.deepcopy(model)
    xkernels.patch(patched)
    ids = torch.randint(0, 64, (2, 8))
    grads = []
    for m, compiled in ((model, False), (patched, True)):
        m.zero_grad(set_to_none=True)
        run = torch.compile(m, backend="aot_eager", fullgraph=True) if compiled else m
        torch._dynamo.reset()
        run(input_ids=ids).logits.float().square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    torch._dynamo.reset()
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, msg=name)


def test_eager_call_skips_reading_positions_it_made(monkeypatch):
    """Eager mode: transformers' check (a host sync) does not run for positions the module made,
    and runs for positions given."""
    model = _llama()
    xkernels.patch(model)
    checked = []
    original = mask_decisions._ORIGINALS["find_packed_sequence_indices"]
    monkeypatch.setitem(mask_decisions._ORIGINALS, "find_packed_sequence_indices",
                        lambda p: checked.append(p) or original(p))
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids)
    assert checked == []
    model(input_ids=ids, position_ids=torch.arange(8)[None])
    assert len(checked) == 1


def test_export_keeps_the_mask():
    """``torch.export`` hard-codes what it traces: transformers keeps the mask there, patched too."""
    patched = _llama()
    xkernels.patch(patched)
    ids = torch.randint(0, 64, (1, 8))
    exported = torch.export.export(patched, (), {"input_ids": ids}, strict=False)
    calls = [n for n in exported.graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    assert calls and all(len(n.args) > 3 and n.args[3] is not None for n in calls)


def test_undo_copies_exceptions_and_threads():
    model = _llama()
    report = xkernels.patch(model)
    assert mask_decisions.targets(model) == []  # patched once
    clone = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 8))
    _, seen = _traced_attention(clone, input_ids=ids)
    assert seen == [(False, True)] * 2
    class Raised(Exception):
        pass

    def raise_it(*args):
        assert mask_decisions.decided_as_eager()  # inside the hooked call
        raise Raised

    handle = model.model.layers[0].register_forward_pre_hook(raise_it)
    with pytest.raises(Raised):
        model(input_ids=ids)
    handle.remove()
    assert not mask_decisions.decided_as_eager()
    states = []
    gate = threading.Event()

    def other() -> None:  # another thread does not see this thread's calls
        gate.wait()
        states.append(mask_decisions.decided_as_eager())

    worker = threading.Thread(target=other)
    worker.start()
    mask_decisions._CALLS.stack.append(True)
    try:
        gate.set()
        worker.join()
    finally:
        mask_decisions._CALLS.stack.pop()
    assert states == [False]
    report.undo()
    assert "_xkernels_mask_hooks" not in model.__dict__ and not model.model._forward_pre_hooks
    _, seen = _traced_attention(model, input_ids=ids)
    assert seen == [(True, False)] * 2


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_sliding_window_masks_are_still_built(family):
    """A sliding window shorter than the sequence needs its mask (transformers' own rule, kept):
    Mistral's every layer keeps a mask; Qwen2 with a full-attention layer under its sliding ones
    runs that one causal. Outputs are the unpatched model's."""
    tf = require_transformers()
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, vocab_size=64, sliding_window=4, use_cache=False, attn_implementation="sdpa",
                  pad_token_id=0)
    torch.manual_seed(0)
    if family == "mistral":
        model, want = tf.MistralForCausalLM(tf.MistralConfig(**common)), [(True, False)] * 2
    else:
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**common, use_sliding_window=True, max_window_layers=1))
        want = [(False, True), (True, False)]  # layer 0 full attention, layer 1 sliding
    model.eval()
    patched = copy.deepcopy(model)
    xkernels.patch(patched)
    ids = torch.randint(0, 64, (2, 8))
    out, seen = _traced_attention(patched, input_ids=ids)
    assert seen == want
    torch.testing.assert_close(out, model(input_ids=ids).logits, rtol=1e-5, atol=1e-6)


def test_a_saved_model_loaded_where_patch_never_ran_decides_as_eager(monkeypatch):
    """Loading installs the replacements: a process that loads a saved patched model has not run
    ``patch()`` (here: transformers' own functions put back before the load)."""
    import io

    from transformers import masking_utils

    model = _llama()
    xkernels.patch(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    for name, original in mask_decisions._ORIGINALS.items():
        monkeypatch.setattr(masking_utils, name, original)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert masking_utils.find_packed_sequence_indices is mask_decisions.find_packed_sequence_indices
    assert masking_utils.is_torchdynamo_exporting is mask_decisions.is_torchdynamo_exporting
    ids = torch.randint(0, 64, (2, 8))
    out, seen = _traced_attention(loaded, input_ids=ids)
    assert seen == [(False, True)] * 2
    torch.testing.assert_close(out, model(input_ids=ids).logits, rtol=1e-5, atol=1e-6)
