"""What the gated_linear kernels compile to for an H100 (sm90), checked on a machine without a GPU.

Each case plans a call with the op's own code (meta tensors, a forced config) and compiles it
for sm90 with the arguments Triton would specialize at launch. The TMA kernel must load x and
both weights with bulk tensor copies, run both accumulators on wgmma and fit a block's shared
memory; the pointer kernel must compile too.
"""

from __future__ import annotations

import pytest
import torch

from xkernels import tuning
from xkernels.backends.cuda import CudaBackend
from xkernels.ops import gated_linear
from xkernels.ops.fused import gated_linear as gated_linear_module
from xkernels.ops.matmul.plan import ACTIVATIONS as ACT_CODES

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

try:
    from triton.backends import backends as _triton_backends
except ImportError:  # pragma: no cover
    _triton_backends = {}
if "nvidia" not in _triton_backends:  # triton-ascend replaces the package and has no CUDA compiler
    pytest.skip(f"this Triton ({triton.__version__}) has no NVIDIA compiler backend", allow_module_level=True)

_TL = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
SMS = 132
SMEM = 232448  # shared memory one block may use on an H100 (227 KiB)


class _H100(CudaBackend):
    def arch(self, device=None) -> str:
        return "sm90"

    def max_programs(self, unit="vector", device=None) -> int:
        return 2**31 - 1

    def compute_units(self, device=None) -> int:
        return SMS

    def tensor_descriptors(self, device=None) -> bool:
        return True


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def _compile(plan, call):
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, N, K = plan.dims
    y = _meta(M, N, dtype=call.dtype)
    bg = call.bg if call.bg is not None else y
    bu = call.bu if call.bu is not None else y
    if plan.tma is not None:
        t = plan.tma
        d = lambda v, b: TensorDescriptor(v, list(v.shape), [v.stride(0), 1], b)  # noqa: E731
        rt = (d(call.x2, t["x"]), d(call.wg, t["w"]), d(call.wu, t["w"]), d(y, t["y"]), d(y, t["y"]), d(y, t["y"]),
              bg, bu, M, N, K)
    else:
        rt = (call.x2, call.wg, call.wu, y, bg, bu, y, y, M, N, K, plan.tiles, plan.programs, *plan.strides)
    fn = plan.launcher.kernel
    names = fn.arg_names
    sig, consts, attrs = {}, dict(plan.constexprs), {}
    for i, (name, v) in enumerate(zip(names, rt)):
        if type(v).__name__ == "TensorDescriptor":
            sig[name] = f"tensordesc<{_TL[v.base.dtype]}{list(v.block_shape)}>"
        elif isinstance(v, torch.Tensor):
            sig[name] = "*" + _TL[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif v == 1:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    for name in names[len(rt):]:
        sig[name] = "constexpr"
    opts = {k: v for k, v in plan.options.items() if k in ("num_warps", "num_stages")}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)


_TMA = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "TMA": True}


_SCHEDULES = {"one tile each": {}, "persistent": {"PERSISTENT": True},
              "persistent + subtile": {"PERSISTENT": True, "EPILOGUE_SUBTILE": True}}


@pytest.mark.parametrize("schedule", list(_SCHEDULES))
@pytest.mark.parametrize("form", ["separate + biases", "concatenated", "kept for backward"])
def test_tma_kernel_loads_through_descriptors_and_runs_wgmma(form, schedule):
    """Llama-3-8B's gate/up at 512 tokens (and Phi-3's concatenated form)."""
    x = _meta(512, 4096)
    if form == "concatenated":
        args = (x, _meta(2 * 1024, 4096))
    else:
        args = (x, _meta(1024, 4096), _meta(1024, 4096), _meta(1024), _meta(1024))
    call = gated_linear.check(*args)
    call.save = form == "kept for backward"
    opts = _SCHEDULES[schedule]
    persistent, subtile = bool(opts.get("PERSISTENT")), bool(opts.get("EPILOGUE_SUBTILE"))
    with tuning.force({**_TMA, **opts}):
        plan = gated_linear.make_plan(call, _H100())
    assert plan.tma is not None and plan.config["TMA"] and plan.constexprs["STORE_PRE"] == call.save
    assert plan.tiles == 4 * 8 and plan.programs == (min(plan.tiles, SMS) if persistent else plan.tiles)
    assert plan.constexprs["PERSISTENT"] == persistent
    kernel = _compile(plan, call)
    ptx = kernel.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx
    stores = ptx.count("cp.async.bulk.tensor.2d.global.shared")
    # y (+ gate and up when kept), per column half; the flattened persistent loop may emit its
    # epilogue twice (a peeled last iteration)
    per_copy = (3 if call.save else 1) * (2 if subtile else 1)
    assert stores in (per_copy, 2 * per_copy if persistent else per_copy), stores
    assert plan.tma["y"] == [plan.config["BLOCK_M"], 64 if subtile else 128]
    assert "setmaxnreg" not in ptx and kernel.metadata.num_warps == plan.options["num_warps"]  # not warp-specialized
    assert kernel.metadata.shared <= SMEM, kernel.metadata.shared


@pytest.mark.parametrize("activation", gated_linear_module.ACTIVATIONS)
def test_tma_kernel_compiles_every_activation(activation):
    """Each activation's epilogue (the one ``_activation`` the matmul kernels share) in the TMA
    kernel's training form (gate and up stored beside y): BitNet's relu2 as SwiGLU's silu."""
    call = gated_linear.check(_meta(512, 4096), _meta(1024, 4096), _meta(1024, 4096), activation=activation)
    call.save = True
    with tuning.force(_TMA):
        plan = gated_linear.make_plan(call, _H100())
    assert plan.tma is not None and plan.constexprs["ACT"] == ACT_CODES[activation]
    kernel = _compile(plan, call)
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and ptx.count("cp.async.bulk.tensor.2d.global.shared") == 3
    assert kernel.metadata.shared <= SMEM, kernel.metadata.shared


def test_tma_plan_refuses_warp_specialization():
    """Triton 3.6's warp specialization wrote NaN into the two-accumulator kernel's output on an
    H100: a config asking for it is refused by name, not run."""
    call = gated_linear.check(_meta(512, 4096), _meta(1024, 4096), _meta(1024, 4096))
    with tuning.force({**_TMA, "PERSISTENT": True, "WARP_SPECIALIZE": True}):
        with pytest.raises(ValueError, match="WARP_SPECIALIZE"):
            gated_linear.make_plan(call, _H100())


def test_pointer_kernel_compiles_for_sm90():
    args = (_meta(300, 1000), _meta(500, 1000), _meta(500, 1000))
    call = gated_linear.check(*args)
    with tuning.force({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}):
        plan = gated_linear.make_plan(call, _H100())
    assert plan.tma is None  # K = 1000 rows: 2000 bytes, 16-byte aligned, but I*2 = 1000 bytes is not
    ptx = _compile(plan, call).asm["ptx"]
    assert "mma" in ptx


@pytest.mark.slow
def test_cuda_table_candidates_compile_within_shared_memory():
    import json
    from pathlib import Path

    table = json.loads((Path(__file__).resolve().parents[3] / "ops" / "tuning" / "cuda" / "gated_linear.json")
                       .read_text())
    call = gated_linear.check(_meta(4096, 4096), _meta(14336, 4096), _meta(14336, 4096))
    for group in table["candidates"]["sm90"]:
        if "bfloat16" not in group["when"]["dtype"]:
            continue
        for cfg in group["configs"]:
            with tuning.force(cfg):
                plan = gated_linear.make_plan(call, _H100())
            assert bool(plan.tma) == bool(cfg.get("TMA"))
            kernel = _compile(plan, call)
            assert kernel.metadata.shared <= SMEM, (cfg, kernel.metadata.shared)
