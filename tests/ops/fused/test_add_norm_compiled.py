"""Training's add + norm inside a torch.compile graph (``ops/fused/add_norm_compiled.py``): which
calls take the compiled form, decided on the cuda backend's sm90 table with no device; its
launches computing what float64 PyTorch computes, forward and backward, on the interpreter; on an
sm90 GPU, a compiled patched BERT layer's training step launching the kernels, its outputs and
gradients matching float64 PyTorch."""

from __future__ import annotations

import copy

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
