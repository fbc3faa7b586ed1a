"""Training's add + norm inside a torch.compile graph (``ops/fused/add_norm_compiled.py``): which
calls take the compiled form, decided on the cuda backend's sm90 table with no device; its
launches computing what float64 PyTorch computes, forward and backward, on the interpreter; on an
sm90 GPU, a compiled patched BERT layer's training step launching the kernels, its outputs and
gradients matching float64 PyTorch."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

import xkernels
from helpers import assert_close, assert_model_close, rand, require_transformers, sm90_planning_backend
from xkernels import dispatch, tuning
from xkernels.ops.fused import add_norm_bwd, add_norm_kernels
from xkernels.ops.fused import add_norm_compiled as compiled

_CUDA = torch.device("cuda", 0)


def _clear():
    for fn in (compiled._forward, compiled._backward, compiled._available):
        fn.cache_clear()


@pytest.fixture
def sm90(monkeypatch):
    be = sm90_planning_backend()
    monkeypatch.setattr(dispatch, "select", lambda device: be)
    _clear()
    yield be
    _clear()


def _fwd(kind="layer", rows=8192, n=768, dtype=torch.bfloat16):
    return compiled.forward_launch(kind, rows, n, dtype, _CUDA, True, True, kind == "layer")


def test_measured_shapes_take_the_compiled_form(sm90):
    """BERT's, ViT's, GPT-2's and a Llama-3-8B stack's rows in bf16: the table's measured rules."""
    assert compiled.available(_CUDA)
    for kind, rows, n in (("layer", 8192, 768), ("layer", 12608, 768), ("layer", 8192, 1024),
                          ("rms", 2048, 4096), ("rms", 8192, 896)):
        spec = _fwd(kind, rows, n)
        assert spec is not None, (kind, rows, n)
        consts = dict(spec.launch.constexprs)
        assert consts["STORE_SUM"] and consts["STORE_STATS"] and consts["RMS"] == (kind == "rms")
        assert spec.launch.scalars == (rows, n, n, n, n, n)


@pytest.mark.parametrize("args,why", [
    (dict(dtype=torch.float16), "fp16: not measured"),
    (dict(dtype=torch.float32), "fp32: not measured"),
    (dict(rows=512), "512 rows: below the measured rows"),
    (dict(rows=65536), "65536 rows: above the measured rows"),
    (dict(n=256), "256 columns: below the measured widths"),
    (dict(n=5120), "5120 columns: the chunked kernel, not measured"),
], ids=["fp16", "fp32", "few rows", "many rows", "narrow", "wide"])
def test_other_calls_trace_the_class_norm(sm90, args, why):
    assert _fwd(**args) is None, why


def test_a_forced_config_other_backends_and_a_torch_backward_keep_the_class_norm(sm90, monkeypatch):
    with tuning.force({"BLOCK_M": 1, "BLOCK_N": 1024}):
        assert _fwd() is None
    monkeypatch.setattr(dispatch, "select", lambda device: xkernels.dispatch.get_backend("cpu"))
    _clear()
    assert _fwd() is None and not compiled.available(_CUDA)
    interp = xkernels.dispatch.get_backend("interpreter")
    monkeypatch.setattr(dispatch, "select", lambda device: interp)
    _clear()
    assert _fwd() is None and not compiled.available(_CUDA)  # no compiled rule for the interpreter's arch
    monkeypatch.setattr(dispatch, "select", lambda device: sm90)
    monkeypatch.setattr(add_norm_bwd, "route", lambda *a: "torch")
    _clear()
    assert _fwd() is None  # a rule sending the backward to PyTorch: the class's norm


def test_the_decisions_are_constants_to_dynamo():
    marked = torch.compiler.assume_constant_result(lambda: None)
    attrs = {k for k in vars(marked) if k.startswith("_dynamo")}
    for fn in (compiled.forward_launch, compiled.backward_launch, compiled.available):
        assert attrs == {"_dynamo_marked_constant"} and all(getattr(fn, k) for k in attrs)


def test_operands_it_cannot_launch_trace_the_class_norm(sm90):
    """No gradient, a strided or broadcast residual, a weight of another dtype, a dynamic-free but
    1-d x: ``None``, decided before anything is launched."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    x = torch.empty(16, 512, 768, **meta).requires_grad_()
    w, b = torch.empty(768, **meta), torch.empty(768, **meta)
    with torch.no_grad():
        assert compiled.add_norm("layer", x, x, w, b, 1e-5, 0.0, False) is None
    assert compiled.add_norm("layer", x.detach(), x.detach(), w, b, 1e-5, 0.0, False) is None
    assert compiled.add_norm("layer", x, torch.empty(16, 512, 1536, **meta)[..., ::2], w, b, 1e-5, 0.0, False) is None
    assert compiled.add_norm("layer", x, torch.empty(768, **meta), w, b, 1e-5, 0.0, False) is None
    assert compiled.add_norm("layer", x, x, w.float(), b, 1e-5, 0.0, False) is None
    assert compiled.add_norm("layer", torch.empty(768, **meta).requires_grad_(), None, w, b, 1e-5, 0.0,
                             False) is None


@pytest.fixture
def interpreted(monkeypatch):
    """The form's launches on the interpreter: every shape takes it (its rule and the
    launchability check bypassed), the kernels the interpreter's, every buffer it allocates NaN."""
    be = xkernels.dispatch.get_backend("interpreter")
    if be.unavailable_reason() is not None:
        pytest.skip(f"needs the interpreter backend ({be.unavailable_reason()})")
    monkeypatch.setattr(compiled, "rule", lambda *a: True)
    monkeypatch.setattr(compiled, "_launchable", lambda kernel: True)
    for name in ("add_norm_kernel", "add_norm_bwd_kernel", "part_sum_kernel"):
        monkeypatch.setattr(add_norm_kernels, name, be.kernel(getattr(add_norm_kernels, name)))
    monkeypatch.setattr(compiled, "_empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype,
                                                                                      device=device))
    _clear()
    with xkernels.use_backend("interpreter"):
        yield
    _clear()


@pytest.mark.uses_interpreter
@pytest.mark.parametrize("kind,dtype,n,return_sum", [
    ("layer", torch.float32, 48, False), ("layer", torch.bfloat16, 40, True), ("rms", torch.bfloat16, 48, False),
    ("rms", torch.float32, 33, True)])
def test_the_form_matches_float64(interpreted, kind, dtype, n, return_sum):
    """Forward and backward (x, residual, weight and, for LayerNorm, bias), against float64
    PyTorch; the returned sum's gradient reaches x and residual; inputs are left unchanged."""
    torch.manual_seed(n)
    x = rand((2, 5, n), dtype, "cpu").requires_grad_()
    r = rand((2, 5, n), dtype, "cpu").requires_grad_()
    w = (1 + 0.1 * torch.randn(n)).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(n)).to(dtype).requires_grad_() if kind == "layer" else None
    leaves = [t for t in (x, r, w, b) if t is not None]
    before = [t.detach().clone() for t in leaves]
    out = compiled.add_norm(kind, x, r, w, b, 1e-5, 0.0, return_sum)
    y, s = out if return_sum else (out, None)
    dy, ds = rand(x.shape, dtype, "cpu"), rand(x.shape, dtype, "cpu")
    loss = (y.double() * dy.double()).sum() + ((s.double() * ds.double()).sum() if return_sum else 0)
    loss.backward()
    ref = [t.detach().double().requires_grad_() for t in leaves]
    sum64 = ref[0] + ref[1]
    if kind == "layer":
        y64 = torch.nn.functional.layer_norm(sum64, (n,), ref[2], ref[3], 1e-5)
    else:
        y64 = sum64 * torch.rsqrt(sum64.pow(2).mean(-1, keepdim=True) + 1e-5) * ref[2]
    ((y64 * dy.double()).sum() + ((sum64 * ds.double()).sum() if return_sum else 0)).backward()
    assert_close(y, y64.detach(), dtype)
    if return_sum:
        assert_close(s, sum64.detach(), dtype)
    for t, e in zip(leaves, ref):
        assert_close(t.grad, e.grad, dtype, scale=4.0)
    for t, was in zip(leaves, before):
        assert torch.equal(t.detach(), was)


def test_kernel_helpers_are_bound_under_their_own_names():
    """Inductor compiles a user-defined kernel from its source, copying each JIT helper by its
    ``def`` name (as ``test_gated_linear_compiled`` checks for the GEMM kernels)."""
    from triton.runtime.jit import JITFunction

    bound = {name: fn.fn.__name__ for name, fn in vars(add_norm_kernels).items() if isinstance(fn, JITFunction)}
    assert bound and all(name == own for name, own in bound.items()), bound


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2", "vit"])
def test_a_compiled_patched_training_step_launches_the_kernels_on_the_device(backend, device, family):
    """On an sm90 GPU: a patched BERT layer (post-norm LayerNorm), a Llama decoder layer (pre-norm
    RMSNorm), a GPT-2 block and a ViT layer (pre-norm LayerNorm) at 4 x 512 tokens, bf16, trained
    one step under torch.compile (Inductor):
    the add + norm kernels run (forward, backward, the parameter sums), and the output and every
    gradient match float64 PyTorch as the unpatched compiled layer's do."""
    if device.type != "cuda" or backend.arch(device) != "sm90":
        pytest.skip(f"backend {backend.name!r} on {device}: the compiled rules are sm90's")
    tf = require_transformers()
    torch.manual_seed(0)
    if family == "bert":
        from transformers.models.bert.modeling_bert import BertLayer

        cfg = tf.BertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        layer, width = BertLayer(cfg), 768
    elif family == "llama":
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        cfg = tf.LlamaConfig(hidden_size=1024, num_attention_heads=8, num_key_value_heads=8, intermediate_size=2816)
        cfg._attn_implementation = "sdpa"
        layer, width = LlamaDecoderLayer(cfg, layer_idx=0), 1024
    elif family == "gpt2":
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        cfg = tf.GPT2Config(n_embd=768, n_head=12, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cfg._attn_implementation = "sdpa"
        layer, width = GPT2Block(cfg, layer_idx=0), 768
    else:
        from transformers.models.vit.modeling_vit import ViTLayer

        cfg = tf.ViTConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072)
        cfg._attn_implementation = "sdpa"
        layer, width = ViTLayer(cfg), 768
    layer = layer.to(device, torch.bfloat16).train()
    ref64 = copy.deepcopy(layer).double()
    plain = copy.deepcopy(layer)
    report = xkernels.patch(layer)
    assert report.blocks, str(report)
    x = rand((4, 512, width), torch.bfloat16, device)
    dy = rand((4, 512, width), torch.bfloat16, device)
    extra = {}
    if family == "llama":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        rotary = LlamaRotaryEmbedding(cfg)
        pos = torch.arange(512, device=device)[None].expand(4, -1)
        extra = dict(position_embeddings=tuple(t.to(device) for t in rotary.to(device)(x, pos)))

    def step(model, inp, kw):
        inp = inp.detach().requires_grad_()
        out = model(inp, **kw)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(dy.to(out.dtype))
        return out, [inp.grad] + [p.grad for p in model.parameters()]

    torch._dynamo.reset()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got, got_grads = step(torch.compile(layer), x, extra)
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    want, want_grads = step(torch.compile(plain), x, extra)
    torch._dynamo.reset()
    kw64 = {k: tuple(t.double() for t in v) for k, v in extra.items()}
    ref, ref_grads = step(ref64, x.double(), kw64)
    assert {"add_norm_kernel", "add_norm_bwd_kernel", "part_sum_kernel"} <= names, sorted(names)[:40]
    assert_model_close(got.detach(), want.detach(), ref.detach())
    assert len(got_grads) == len(ref_grads)
    for g, w, e in zip(got_grads, want_grads, ref_grads):
        assert_model_close(g, w, e)


# -- dropout inside the form (BERT's post-norm blocks in training) ----------------------------------
def philox4(seed: int, counters: np.ndarray) -> list[np.ndarray]:
    """NumPy reference of ``add_norm_kernels._uniform4``: the four words of Philox-4x32-10 at
    counter (lo, hi, 0, 0) under the key (seed lo, seed hi), each as a float32 in [0, 1)."""
    mask32 = np.uint64(0xFFFFFFFF)
    c0 = counters.astype(np.uint64) & mask32
    c1 = counters.astype(np.uint64) >> np.uint64(32)
    c2, c3 = np.zeros_like(c0), np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    a_mul, b_mul = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        a0, a2 = c0, c2
        c0 = ((b_mul * a2) >> np.uint64(32)) ^ c1 ^ k0
        c2 = ((a_mul * a0) >> np.uint64(32)) ^ c3 ^ k1
        c1, c3 = (b_mul * a2) & mask32, (a_mul * a0) & mask32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask32, (k1 + np.uint64(0xBB67AE85)) & mask32
    words = []
    for c in (c0, c1, c2, c3):
        v = c.astype(np.uint32).view(np.int32).astype(np.int64)
        words.append(np.where(v < 0, -v - 1, v).astype(np.float32) * np.float32(4.6566127342e-10))
    return words


def test_the_philox_reference_gives_the_published_answer():
    """Random123's known answer for Philox-4x32-10 at counter 0, key 0."""
    want = (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    got = philox4(0, np.array([0]))
    for g, w in zip(got, want):
        w = w - 2**32 if w >= 2**31 else w
        assert g[0] == np.float32(-w - 1 if w < 0 else w) * np.float32(4.6566127342e-10)


def _kept(seed: torch.Tensor, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """The form's keep mask of a call whose x has ``shape`` (rows of the last dim): column ``col``
    of row ``r`` is word ``col % 4`` of the draw at counter ``r * ceil(n / 4) + col // 4``."""
    n = shape[-1]
    rows, quads = math.prod(shape[:-1]), (n + 3) // 4
    words = philox4(int(seed.item()), np.arange(rows * quads).reshape(rows, quads))
    cols = np.arange(n)
    u = np.stack(words)[cols % 4, :, cols // 4].T  # (rows, n)
    return torch.from_numpy(u >= np.float32(p)).reshape(shape)


@pytest.fixture
def dropout_form(backend, device, monkeypatch):
    """The form's dropout launches on the backend under test, every shape taking it (its rule
    bypassed), every buffer it allocates NaN: the interpreters' kernels, or the device's own."""
    if not backend.runs_triton:
        x = torch.ones(4, 8, device=device, requires_grad=True)
        assert compiled.add_norm("layer", x, x.detach(), None, None, 1e-5, 0.0, False, dropout=0.1) is None
        pytest.skip(f"backend {backend.name!r} runs no Triton kernels: the form answers None (checked)")
    monkeypatch.setattr(compiled, "rule", lambda *a: True)
    if device.type == "cpu":
        monkeypatch.setattr(compiled, "_launchable", lambda kernel: True)
        for name in ("add_norm_dropout_kernel", "add_norm_dropout_bwd_kernel", "part_sum_kernel"):
            monkeypatch.setattr(add_norm_kernels, name, backend.kernel(getattr(add_norm_kernels, name)))
    monkeypatch.setattr(compiled, "_empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype,
                                                                                      device=device))
    seeds = []
    draw = compiled._seed
    monkeypatch.setattr(compiled, "_seed", lambda device: seeds.append(draw(device)) or seeds[-1])
    _clear()
    yield seeds
    _clear()


@pytest.mark.parametrize("kind,dtype,n,return_sum,p", [
    ("layer", torch.float32, 48, False, 0.1), ("layer", torch.bfloat16, 40, True, 0.5),
    ("rms", torch.bfloat16, 48, False, 0.25), ("rms", torch.float32, 33, True, 0.1),
    ("layer", torch.bfloat16, 2502, True, 0.1)])  # rows in chunks on the interpreter (its BLOCK_N caps at 1024)
def test_the_dropout_form_matches_float64_on_its_mask(dropout_form, device, kind, dtype, n, return_sum, p):
    """``norm(dropout(x, p) + residual)``: the mask is the Philox reference's for the seed the call
    drew; forward and backward (x through the mask and the ``1 / (1 - p)`` scale, residual, weight,
    bias) against float64 PyTorch on that mask; inputs left unchanged."""
    torch.manual_seed(n)
    shape = (3, 7, n) if n < 1000 else (2, n)
    x = rand(shape, dtype, device).requires_grad_()
    r = rand(shape, dtype, device).requires_grad_()
    w = (1 + 0.1 * torch.randn(n)).to(dtype).to(device).requires_grad_()
    b = (0.1 * torch.randn(n)).to(dtype).to(device).requires_grad_() if kind == "layer" else None
    leaves = [t for t in (x, r, w, b) if t is not None]
    before = [t.detach().clone() for t in leaves]
    out = compiled.add_norm(kind, x, r, w, b, 1e-5, 0.0, return_sum, dropout=p)
    assert out is not None and len(dropout_form) == 1
    keep = _kept(dropout_form[0], x.shape, p).to(device)
    y, s = out if return_sum else (out, None)
    dy, ds = rand(x.shape, dtype, device), rand(x.shape, dtype, device)
    ((y.double() * dy.double()).sum() + ((s.double() * ds.double()).sum() if return_sum else 0)).backward()
    ref = [t.detach().double().requires_grad_() for t in leaves]
    sum64 = torch.where(keep, ref[0] / (1 - p), 0.0) + ref[1]
    if kind == "layer":
        y64 = torch.nn.functional.layer_norm(sum64, (n,), ref[2], ref[3], 1e-5)
    else:
        y64 = sum64 * torch.rsqrt(sum64.pow(2).mean(-1, keepdim=True) + 1e-5) * ref[2]
    ((y64 * dy.double()).sum() + ((sum64 * ds.double()).sum() if return_sum else 0)).backward()
    assert_close(y, y64.detach(), dtype, scale=2.0)
    if return_sum:
        assert_close(s, sum64.detach(), dtype, scale=2.0)
    for t, e in zip(leaves, ref):
        assert_close(t.grad, e.grad, dtype, scale=4.0)
    assert torch.equal(x.grad == 0, ~keep), "d(x) is zero exactly where x was dropped"
    for t, was in zip(leaves, before):
        assert torch.equal(t.detach(), was)


def test_each_dropout_call_draws_its_own_seed_from_torch(dropout_form, device):
    """Each call draws a new seed from torch's generator: two calls drop different elements, about
    ``p`` of them; ``torch.manual_seed`` repeats a call's mask."""
    p, rows, n = 0.25, 64, 256
    x = rand((rows, n), torch.float32, device).requires_grad_()
    r = rand((rows, n), torch.float32, device)

    def dropped_sum():
        s = compiled.add_norm("layer", x, r, None, None, 1e-5, 0.0, True, dropout=p)[1]
        return (s.detach() == r).cpu()  # x dropped: the sum is the residual itself

    torch.manual_seed(11)
    first, second = dropped_sum(), dropped_sum()
    torch.manual_seed(11)
    again = dropped_sum()
    assert not torch.equal(first, second) and torch.equal(first, again)
    assert abs(first.float().mean().item() - p) < 0.02 and abs(second.float().mean().item() - p) < 0.02
    assert len({int(t.item()) for t in dropout_form}) == 2


def test_dropout_without_a_residual_or_out_of_range_traces_the_class_norm(sm90):
    meta = dict(device="meta", dtype=torch.bfloat16)
    x = torch.empty(16, 512, 768, **meta).requires_grad_()
    w, b = torch.empty(768, **meta), torch.empty(768, **meta)
    assert compiled.add_norm("layer", x, None, w, b, 1e-5, 0.0, False, dropout=0.1) is None
    for p in (1.0, -0.1, 1.5):
        assert compiled.add_norm("layer", x, x, w, b, 1e-5, 0.0, False, dropout=p) is None
    assert compiled.forward_launch("layer", 8192, 768, torch.bfloat16, _CUDA, False, True, True, True) is None


@pytest.fixture
def cleared():
    """The form's cached decisions cleared before and after the test (it bypasses their rules)."""
    _clear()
    yield
    _clear()


def test_a_compiled_patched_bert_layer_applies_its_dropout_in_the_kernels_on_the_device(backend, device, monkeypatch,
                                                                                       cleared):
    """On an sm90 GPU: a patched BERT layer in training with hidden dropout 0.1, 4 x 512 tokens,
    bf16, one step under torch.compile: both output blocks run the dropout kernels, and with the
    seed held fixed (so the mask is the Philox reference's) the output and every gradient match
    float64 PyTorch with that mask as the unpatched compiled layer's do with it."""
    if device.type != "cuda" or backend.arch(device) != "sm90":
        pytest.skip(f"backend {backend.name!r} on {device}: the compiled rules are sm90's")
    tf = require_transformers()
    from transformers.models.bert.modeling_bert import BertLayer

    p, seed = 0.1, 0x1234_5678_9ABC
    monkeypatch.setattr(compiled, "_seed", lambda device: torch.full((1,), seed, dtype=torch.int64, device=device))
    monkeypatch.setattr(compiled, "rule", lambda *a: True)  # the numerics, whatever the table's rules
    monkeypatch.setattr(compiled, "available", torch.compiler.assume_constant_result(lambda device, dropout=False: True))
    keep = _kept(torch.tensor(seed), (4, 512, 768), p).to(device)

    class Masked(torch.nn.Module):  # torch's dropout on the form's mask: x * (1 / (1 - p)) rounded, or 0
        def forward(self, x):
            return torch.where(keep, (x.float() * (1.0 / (1.0 - p))).to(x.dtype) if x.dtype != torch.float64
                               else x / (1 - p), 0.0)

    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072, hidden_dropout_prob=p,
                        attention_probs_dropout_prob=0.0)
    layer = BertLayer(cfg).to(device, torch.bfloat16).train()
    plain, ref64 = copy.deepcopy(layer), copy.deepcopy(layer).double()
    for m in (plain, ref64):
        m.attention.output.dropout, m.output.dropout = Masked(), Masked()
    assert xkernels.patch(layer).blocks
    x, dy = rand((4, 512, 768), torch.bfloat16, device), rand((4, 512, 768), torch.bfloat16, device)

    def step(model, inp):
        inp = inp.detach().requires_grad_()
        out = model(inp)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(dy.to(out.dtype))
        return out, [inp.grad] + [q.grad for q in model.parameters()]

    torch._dynamo.reset()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got, got_grads = step(torch.compile(layer), x)
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    want, want_grads = step(torch.compile(plain), x)
    torch._dynamo.reset()
    ref, ref_grads = step(ref64, x.double())
    assert {"add_norm_dropout_kernel", "add_norm_dropout_bwd_kernel", "part_sum_kernel"} <= names, sorted(names)[:40]
    assert_model_close(got.detach(), want.detach(), ref.detach())
    for g, w, e in zip(got_grads, want_grads, ref_grads):
        assert_model_close(g, w, e)
