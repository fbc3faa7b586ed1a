"""``linear`` + activation inside a torch.compile graph as a user-defined Triton kernel
(``ops/matmul/compiled.py``): which calls take it, decided on the cuda backend's sm90 table with
no device; on an sm90 GPU, the compiled patched layer's graph holds the kernel and its result is
eager's."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import assert_close, rand, require_transformers
from xkernels import dispatch, tuning
from xkernels.ops.matmul import compiled, reference_linear

_CUDA = torch.device("cuda", 0)


@pytest.fixture
def sm90(monkeypatch):
    """The cuda backend's planning for an sm90 part (tests/ops/matmul/test_codegen.py's), selected
    for any device."""
    from test_codegen import _H100

    be = _H100()
    monkeypatch.setattr(be, "tensor_descriptors", lambda device=None: True)
    monkeypatch.setattr(dispatch, "select", lambda device: be)
    compiled._spec.cache_clear()
    yield be
    compiled._spec.cache_clear()


def test_berts_and_vits_ffn_up_projection_launch_the_tma_kernel(sm90):
    """gelu at 768 -> 3072 in bf16 (the rules measured 1.26-1.27x): the persistent TMA kernel,
    two programs per SM, its PTX GELU, the weight read K-major through its descriptor."""
    for m in (4096, 8192, 12608):
        spec = compiled.launch_spec(m, 768, 3072, torch.bfloat16, _CUDA, True, "gelu", 0.01)
        assert spec is not None, m
        consts = dict(spec.constexprs)
        assert spec.grid == 2 * 132 and consts["PERSISTENT"] and consts["ACT"] == 7 and consts["B_KMAJOR"]
        assert consts["HAS_BIAS"] and not consts["A_MMAJOR"]
        assert spec.a_block == (128, 64) and spec.b_block == (128, 64) and spec.c_block == (128, 64)
        assert dict(spec.options) == {"num_warps": 8, "num_stages": 3}
        assert "gelu (fast erf, SFU rcp/ex2 by PTX)" in spec.variant


@pytest.mark.parametrize("args,why", [
    ((8192, 768, 3072, torch.float16, "gelu"), "its rule measured 1.048x"),
    ((2048, 768, 3072, torch.bfloat16, "gelu"), "the BLAS won its rule"),
    ((8192, 1024, 4096, torch.bfloat16, "gelu"), "the TMA rule measured 0.972x"),
    ((8192, 768, 3072, torch.float32, "gelu"), "fp32: the pointer kernel"),
], ids=["fp16 8192", "2048 tokens", "1024 -> 4096", "fp32"])
def test_other_calls_keep_pytorchs_ops(sm90, args, why):
    m, k, n, dtype, act = args
    assert compiled.launch_spec(m, k, n, dtype, _CUDA, True, act, 0.01) is None, why


def test_a_forced_config_or_a_backend_without_descriptors_keeps_pytorchs_ops(sm90, monkeypatch):
    with tuning.force({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "TMA": True}):
        assert compiled.launch_spec(8192, 768, 3072, torch.bfloat16, _CUDA, True, "gelu", 0.01) is None
    monkeypatch.setattr(sm90, "tensor_descriptors", lambda device=None: False)
    compiled._spec.cache_clear()
    assert compiled.launch_spec(8192, 768, 3072, torch.bfloat16, _CUDA, True, "gelu", 0.01) is None


def test_the_decision_is_a_constant_to_dynamo():
    """``launch_spec`` carries what ``torch.compiler.assume_constant_result`` sets (set directly:
    importing torch._dynamo would slow every import of the ops)."""
    marked = torch.compiler.assume_constant_result(lambda: None)
    attrs = {k for k in vars(marked) if k.startswith("_dynamo")}
    assert attrs == {"_dynamo_marked_constant"} and all(getattr(compiled.launch_spec, k) for k in attrs)
    assert compiled.launch_spec(64, 32, 16, torch.float32, torch.device("cpu"), True, "gelu", 0.01) is None


def test_a_compiled_patched_gpt2_mlp_runs_the_blas_epilogue_on_the_device(backend, device):
    """On a GPU whose backend lists gelu_tanh among its BLAS epilogues: a patched GPT-2 MLP
    (``Conv1D`` 768 -> 3072, gelu_tanh, ``Conv1D`` back) under torch.compile (Inductor),
    inference: the compiled result matches float64 PyTorch as eager's does."""
    if device.type != "cuda" or "gelu_tanh" not in backend.vendor_epilogues:
        pytest.skip(f"backend {backend.name!r} on {device}: no BLAS gelu_tanh epilogue here")
    tf = require_transformers()
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    torch._dynamo.reset()
    mlp = GPT2MLP(3072, tf.GPT2Config(n_embd=768, resid_pdrop=0.0)).to(device, torch.bfloat16).eval()
    xkernels.patch(mlp)
    x = rand((8, 128, 768), torch.bfloat16, device)
    with torch.no_grad():
        got = torch.compile(mlp, fullgraph=True)(x)
        eager = mlp(x)
    torch._dynamo.reset()
    f = torch.nn.functional
    h = f.gelu(x.double() @ mlp.c_fc.weight.double() + mlp.c_fc.bias.double(), approximate="tanh")
    ref = h @ mlp.c_proj.weight.double() + mlp.c_proj.bias.double()
    assert_close(got, ref, torch.bfloat16, scale=4.0)
    assert_close(eager, ref, torch.bfloat16, scale=4.0)


def test_a_compiled_patched_ffn_launches_the_kernel_on_the_device(backend, device):
    """On an sm90 GPU: a patched Linear(768, 3072) + GELU under torch.compile (Inductor), inference:
    the graph Dynamo hands Inductor holds one user-defined Triton kernel and no GEMM of its own for
    the up-projection, and the result matches float64 PyTorch as eager's does."""
    if device.type != "cuda" or not backend.tensor_descriptors(device) or backend.arch(device) != "sm90":
        pytest.skip(f"backend {backend.name!r} on {device}: no sm90 tensor descriptors here")
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU()).to(device, torch.bfloat16)
    xkernels.patch(model)
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    x = rand((8, 512, 768), torch.bfloat16, device)
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True, backend=recording)(x)
        eager = model(x)
    torch._dynamo.reset()
    assert any("triton_kernel_wrapper" in t for t in targets), targets
    assert not any("linear" in t or "addmm" in t for t in targets), targets
    lin = model[0]
    ref = reference_linear(x.double(), lin.weight.double(), lin.bias.double(), "gelu")
    assert_close(got, ref, torch.bfloat16, scale=4.0)
    assert_close(eager, ref, torch.bfloat16, scale=4.0)


def test_blas_epilogues_trace_where_eager_runs_them(sm90, monkeypatch):
    """relu and gelu_tanh in fp16 / bf16 on a backend listing them: the BLAS's epilogue; gelu
    (erf), fp32, a forced config or the cpu backend: PyTorch's ops."""
    assert compiled.vendor_epilogue(torch.bfloat16, _CUDA, "gelu_tanh")
    assert compiled.vendor_epilogue(torch.float16, _CUDA, "relu")
    assert not compiled.vendor_epilogue(torch.bfloat16, _CUDA, "gelu")
    assert not compiled.vendor_epilogue(torch.float32, _CUDA, "gelu_tanh")
    with tuning.force({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}):
        assert not compiled.vendor_epilogue(torch.bfloat16, _CUDA, "gelu_tanh")
    monkeypatch.setattr(dispatch, "select", lambda device: xkernels.dispatch.get_backend("cpu"))
    assert not compiled.vendor_epilogue(torch.bfloat16, _CUDA, "gelu_tanh")
    assert getattr(compiled.vendor_epilogue, "_dynamo_marked_constant", False)


def test_a_traced_gelu_tanh_linear_is_one_blas_call(monkeypatch):
    """While Dynamo traces (here on the CPU, the decision forced): a patched GPT-2-style
    ``Conv1D`` + gelu_tanh and a ``Linear`` + relu each trace one ``torch._addmm_activation`` and
    no separate activation, with and without a bias; training calls trace ``F.linear`` + activation."""
    Conv1D = require_transformers("pytorch_utils").Conv1D
    monkeypatch.setattr(compiled, "vendor_epilogue", lambda dtype, device, activation: True)
    for layers in ((Conv1D(48, 16), torch.nn.GELU(approximate="tanh")), (torch.nn.Linear(16, 48), torch.nn.ReLU()),
                   (torch.nn.Linear(16, 48, bias=False), torch.nn.ReLU())):
        model = torch.nn.Sequential(*layers)
        xkernels.patch(model)
        for grad in (False, True):
            targets = []

            def recording(gm, example_inputs, targets=targets):
                targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
                return gm.forward

            torch._dynamo.reset()
            with torch.set_grad_enabled(grad):
                torch.compile(model, fullgraph=True, backend=recording)(torch.randn(2, 5, 16))
            torch._dynamo.reset()
            fused = [t for t in targets if "_addmm_activation" in t]
            assert len(fused) == (0 if grad else 1), (grad, targets)
            assert grad or not [t for t in targets if "gelu" in t or "relu" in t or "linear" in t], targets
