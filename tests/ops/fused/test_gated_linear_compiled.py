"""``gated_linear`` inside a torch.compile graph as a user-defined Triton kernel
(``ops/fused/gated_linear_compiled.py``): which calls take it, decided on the cuda backend's sm90
table with no device; on an sm90 GPU, a compiled patched Llama MLP's graph holds the kernel and
its result matches float64 PyTorch."""

from __future__ import annotations

import copy

import pytest
import torch

import xkernels
from helpers import assert_close, rand, require_transformers, sm90_planning_backend
from xkernels import dispatch, tuning
from xkernels.ops.fused import gated_linear_compiled as compiled
from xkernels.ops.fused.gated_linear import reference_gated_linear

_CUDA = torch.device("cuda", 0)
_LLAMA_8B = (4096, 14336)  # H, I


@pytest.fixture
def sm90(monkeypatch):
    be = sm90_planning_backend()
    monkeypatch.setattr(dispatch, "select", lambda device: be)
    compiled._spec.cache_clear()
    yield be
    compiled._spec.cache_clear()


def _spec(m, dtype=torch.bfloat16, act="silu", concatenated=False, bias=False, hk=_LLAMA_8B):
    h, i = hk
    return compiled.launch_spec(m, h, i, dtype, _CUDA, concatenated, bias, bias and not concatenated, act)


def test_decode_sizes_launch_the_fused_kernel(sm90):
    """Llama-3-8B's MLP at 1-16 tokens: the pointer kernel (its rule measured >= 1.005x the vendor
    route); at 17-64 the TMA kernel (>= 1.066x, above the descriptors' margin)."""
    for m in (1, 4, 16):
        spec = _spec(m)
        assert spec is not None and spec.tma is None and len(spec.strides) == 10, m
        assert dict(spec.constexprs)["BLOCK_K"] == 128 and not dict(spec.constexprs)["STORE_PRE"]
        assert "x read once" in spec.variant
    for m in (17, 64):
        spec = _spec(m)
        assert spec is not None and spec.tma == ((64, 128), (64, 128), (64, 64)), m
        assert "TMA" in spec.variant
    assert _spec(8, torch.float16, "gelu_tanh", hk=(3072, 24576)) is not None  # Gemma-7B's MLP


@pytest.mark.parametrize("args,why", [
    (dict(m=128), "128 tokens: the vendor route (the H200 measured the fused kernel slower)"),
    (dict(m=2048), "prefill: cuBLAS wins"),
    (dict(m=8, dtype=torch.float32), "fp32: no measured rule"),
    (dict(m=8, act="relu"), "relu: no measured rule"),
    (dict(m=8, bias=True), "biases: outside the measured envelope"),
    (dict(m=8, hk=(1024, 2048)), "a small MLP: outside the measured envelope"),
    (dict(m=32, concatenated=True), "a concatenated gate_up weight on the TMA kernel"),
], ids=["128 tokens", "2048 tokens", "fp32", "relu", "bias", "small", "gate_up TMA"])
def test_other_calls_trace_the_class_forward(sm90, args, why):
    assert _spec(**args) is None, why


def test_a_forced_config_or_the_cpu_backend_keeps_the_class_forward(sm90, monkeypatch):
    with tuning.force({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}):
        assert _spec(8) is None
    monkeypatch.setattr(dispatch, "select", lambda device: xkernels.dispatch.get_backend("cpu"))
    compiled._spec.cache_clear()
    assert _spec(8) is None


def test_the_decision_is_a_constant_to_dynamo():
    marked = torch.compiler.assume_constant_result(lambda: None)
    attrs = {k for k in vars(marked) if k.startswith("_dynamo")}
    assert attrs == {"_dynamo_marked_constant"} and all(getattr(compiled.launch_spec, k) for k in attrs)


def test_operands_it_cannot_launch_on_trace_the_class_forward(sm90):
    """A strided x, weights of another dtype or a mismatched up weight: ``None`` (the class's
    forward), decided before anything is launched."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    h, i = _LLAMA_8B
    w, uw = torch.empty(i, h, **meta), torch.empty(i, h, **meta)
    assert compiled.gated(torch.empty(8, 2 * h, **meta)[:, ::2], w, uw, None, None, "silu") is None
    assert compiled.gated(torch.empty(8, h, **meta), w, uw.float(), None, None, "silu") is None
    assert compiled.gated(torch.empty(8, h, **meta), w, uw[:-1], None, None, "silu") is None
    assert compiled.gated(torch.empty(8, h + 1, **meta), w, uw, None, None, "silu") is None


@pytest.mark.parametrize("family,tokens", [("llama", 8), ("llama", 48), ("phi3", 8)])
def test_a_compiled_patched_gated_mlp_launches_the_kernel_on_the_device(backend, device, family, tokens):
    """On an sm90 GPU: a patched Llama MLP at Llama-3-8B's width (pointer and TMA kernels) and a
    Phi-3-mini MLP (one concatenated gate_up projection: the pointer kernel on its halves) under
    torch.compile (Inductor), inference at decode sizes: the graph holds one user-defined Triton
    kernel for gate and up (the down-projection stays a GEMM), and the result matches float64
    PyTorch as eager's does."""
    if device.type != "cuda" or not backend.tensor_descriptors(device) or backend.arch(device) != "sm90":
        pytest.skip(f"backend {backend.name!r} on {device}: no sm90 tensor descriptors here")
    tf = require_transformers()
    torch._dynamo.reset()
    if family == "llama":
        from transformers.models.llama.modeling_llama import LlamaMLP

        h, i = _LLAMA_8B
        mlp = LlamaMLP(tf.LlamaConfig(hidden_size=h, intermediate_size=i))
    else:
        from transformers.models.phi3.modeling_phi3 import Phi3MLP

        h, i = 3072, 8192
        mlp = Phi3MLP(tf.Phi3Config(hidden_size=h, intermediate_size=i))
    mlp = mlp.to(device, torch.bfloat16)
    original = copy.deepcopy(mlp)
    report = xkernels.patch(mlp)
    assert [b.fusion for b in report.blocks] == ["gated mlp" if family == "llama" else "gated mlp (gate_up)"]
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    x = rand((1, tokens, h), torch.bfloat16, device)
    with torch.no_grad():
        got = torch.compile(mlp, fullgraph=True, backend=recording)(x)
        want = original(x)
    torch._dynamo.reset()
    assert sum("triton_kernel_wrapper" in t for t in targets) == 1, targets
    assert sum("linear" in t or "addmm" in t or t.endswith("mm.default") for t in targets) == 1, targets
    w = original
    if family == "llama":
        gated = reference_gated_linear(x.double(), w.gate_proj.weight.double(), w.up_proj.weight.double(),
                                       activation="silu")
    else:
        gated = reference_gated_linear(x.double(), w.gate_up_proj.weight.double(), activation="silu")
    ref = torch.nn.functional.linear(gated, w.down_proj.weight.double())
    assert_close(got, ref, torch.bfloat16, scale=4.0)
    assert_close(want, ref, torch.bfloat16, scale=4.0)


@pytest.mark.parametrize("module", ["xkernels.ops.fused.gated_linear_kernels", "xkernels.ops.matmul.kernels"])
def test_kernel_helpers_are_bound_under_their_own_names(module):
    """Inductor compiles a user-defined kernel from its source, copying each JIT helper it calls
    by the helper's ``def`` name: a helper bound under another name (``x = triton.jit(f.fn)``)
    compiled on the device as a NameError. Every JIT function of the modules whose kernels a
    compiled graph launches is bound under its own name."""
    import importlib

    from triton.runtime.jit import JITFunction

    mod = importlib.import_module(module)
    bound = {name: fn.fn.__name__ for name, fn in vars(mod).items() if isinstance(fn, JITFunction)}
    assert bound and all(name == own for name, own in bound.items()), bound
