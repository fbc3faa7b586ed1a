"""What the matmul kernel compiles to for an H100 (sm90), checked on a machine without a GPU.

Triton's CUDA compiler runs on the CPU. Each case plans a call with the op's own code (the cuda
backend's sm90 table, meta tensors) and compiles it with the arguments Triton would specialize
at launch. At shapes whose rows are 16-byte aligned but not 16-element multiples (K = 1000 in
bf16), the kernel must still copy A and B tiles with 16-byte pipelined copies
(``cp.async ... 16``) and feed wgmma; without the divisibility hints it loads one element at a
time (measured 0.21x torch on an H100 for 3000x1000 @ 1000x5000).
"""

from __future__ import annotations

import re

import pytest
import torch

from xkernels import tuning
from xkernels.backends.cuda import CudaBackend
from xkernels.ops import linear, matmul
from xkernels.ops.matmul.plan import ACTIVATIONS

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
SMS = 132  # the fake H100's SMs: the grid of a persistent kernel
SMEM = 232448  # shared memory one block may use on an H100 (227 KiB)
SM_SMEM = 233472  # shared memory of one H100 SM (228 KiB), shared by its resident blocks
BLOCK_RESERVED = 1024  # shared memory the driver reserves per resident block (sm80+)
SM_REGS = 65536  # 32-bit registers of one SM


class _H100(CudaBackend):
    """The cuda backend's planning for an sm90 part, no device needed."""

    def arch(self, device=None) -> str:
        return "sm90"

    def max_programs(self, unit="vector", device=None) -> int:
        return 2**31 - 1

    def compute_units(self, device=None) -> int:
        return SMS


class _H100Pointers(_H100):
    """The same without tensor descriptors: the pointer kernel (Triton < 3.4; pre-sm90 layouts)."""

    def tensor_descriptors(self, device=None) -> bool:
        return False


def _ptx(op, *args, hints: bool = True, backend=None, residual=None) -> str:
    return _compile(op, *args, hints=hints, backend=backend, residual=residual)[1].asm["ptx"]


#: the config code-generation tests compile when none is forced (which config a shape gets is
#: tests/ops/matmul/test_config.py's business; a table rule may even route it to the vendor BLAS)
_POINTER = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def _compile(op, *args, hints: bool = True, backend=None, residual=None):
    """(plan, kernel compiled for sm90) of a call (``linear``'s ``residual=``, where given)."""
    call = op.check(*args) if residual is None else op.check(*args, residual=residual)
    if tuning.forced_config() is None:
        with tuning.force(_POINTER):
            plan = op.make_plan(call, backend or _H100Pointers())
    else:
        plan = op.make_plan(call, backend or _H100Pointers())
    if not hints:  # what the kernel compiled to before the hints: every DIV_* = 1
        plan.constexprs.update({k: 1 for k in plan.constexprs if k.startswith("DIV_")})
    c = torch.empty(tuple(call.batch) + (call.a.shape[-2], call.b.shape[-1]), dtype=call.result_dtype, device="meta")
    rt = plan.args(call.a, call.b, c, call.bias, call.slope, call.residual)
    names = plan.jit_fn.arg_names
    sig, consts, attrs = {}, dict(plan.constexprs), {}
    for i, (name, v) in enumerate(zip(names, rt)):
        if type(v).__name__ == "TensorDescriptor":
            sig[name] = f"tensordesc<{_TL[v.base.dtype]}{list(v.block_shape)}>"
        elif isinstance(v, torch.Tensor):
            sig[name] = "*" + _TL[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # fresh allocations are 256-byte aligned
        elif isinstance(v, float):
            sig[name] = "fp32"
        elif v == 1:  # Triton specializes ints equal to 1 into constants
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    for name in names[len(rt):]:
        sig[name] = "constexpr"
    opts = {k: v for k, v in plan.options.items() if k in ("num_warps", "num_stages")}
    compiled = triton.compile(ASTSource(plan.jit_fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                              options=opts)
    return plan, compiled


def _copies(ptx: str) -> tuple[int, int]:
    """(16-byte async copies to shared memory, scalar 16-bit global loads)."""
    wide = len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*,\s*0x10", ptx))
    narrow = len(re.findall(r"ld\.global(?:\.[a-z:0-9]+)*\.b16\b", ptx))
    return wide, narrow


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_odd_shape_gets_vector_copies_and_wgmma():
    ptx = _ptx(matmul, _meta(3000, 1000), _meta(1000, 5000))
    wide, narrow = _copies(ptx)
    assert wide > 0 and narrow == 0, (wide, narrow)
    assert "wgmma.mma_async" in ptx


def test_without_hints_the_same_shape_loads_elements_one_by_one():
    # the contrast that makes the test above meaningful
    wide, narrow = _copies(_ptx(matmul, _meta(3000, 1000), _meta(1000, 5000), hints=False))
    assert wide == 0 and narrow > 0, (wide, narrow)


def test_linear_layout_odd_features_gets_vector_copies():
    wide, narrow = _copies(_ptx(linear, _meta(3000, 1000), _meta(5000, 1000), None, "gelu"))
    assert wide > 0 and narrow == 0, (wide, narrow)
    # with a bias: the bias row is read once per tile, element-wise in the accumulator's layout
    wide, narrow = _copies(_ptx(linear, _meta(3000, 1000), _meta(5000, 1000), _meta(5000), "gelu"))
    assert wide > 0 and narrow <= 1, (wide, narrow)


def test_hints_are_visible_in_explain_and_absent_for_multiples_of_16():
    with tuning.force({}):
        odd = matmul.make_plan(matmul.check(_meta(3000, 1000), _meta(1000, 5000)), _H100Pointers())
        even = matmul.make_plan(matmul.check(_meta(4096, 4096), _meta(4096, 4096)), _H100Pointers())
    assert odd.config["divisibility hints"] == {"DIV_N": 8, "DIV_K": 8, "DIV_SAM": 8, "DIV_SBK": 8, "DIV_SCM": 8}
    assert "divisibility hints" not in even.config
    assert not odd.align_a and not odd.align_b  # 16-byte rows need no copy


@pytest.mark.parametrize("op,args", [
    (matmul, (_meta(4096, 4096), _meta(4096, 4096))),
    (linear, (_meta(4096, 4096), _meta(4096, 4096), _meta(4096), "gelu")),  # K-contiguous weight
    (matmul, (_meta(3000, 1000), _meta(1000, 5000))),  # edges zero-filled by the TMA engine
], ids=["matmul 4096", "linear 4096 bias gelu", "matmul odd"])
def test_large_sm90_calls_load_through_tensor_descriptors(op, args):
    """A TMA config compiles to bulk tensor copies and wgmma, no per-thread operand copies (which
    classes take TMA is the table's business: test_tma_follows_the_table_rule)."""
    with tuning.force(_TMA):
        plan = op.make_plan(op.check(*args), _H100())
        assert plan.config.get("TMA") is True and "TMA" in plan.variant
        ptx = _ptx(op, *args, backend=_H100())
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx
    wide, narrow = _copies(ptx)
    assert wide == 0 and narrow <= 1, (wide, narrow)  # no per-thread operand copies; 1: linear's bias row


@pytest.mark.parametrize("dtype,act,ptx_gelu", [(torch.bfloat16, "gelu", True), (torch.float16, "gelu", True),
                                                (torch.float32, "gelu", False), (torch.bfloat16, "silu", False),
                                                (torch.bfloat16, "quick_gelu", False), (torch.bfloat16, "relu2", False)],
                         ids=["bf16 gelu", "fp16 gelu", "fp32 gelu", "bf16 silu", "bf16 quick_gelu", "bf16 relu2"])
def test_tma_gelu_into_half_precision_takes_the_sfu_by_ptx(dtype, act, ptx_gelu):
    """On NVIDIA the TMA kernel's GELU into an fp16/bf16 C is the fast erf with one SFU reciprocal
    and one SFU exponential per element (``ACT`` 7: inline ``rcp.approx.ftz`` / ``ex2.approx.ftz``),
    said by ``explain()``; an fp32 C keeps libdevice's erf, other activations their own code."""
    args = (_meta(8192, 768, dtype=dtype), _meta(3072, 768, dtype=dtype), _meta(3072, dtype=dtype), act)
    with tuning.force(_TMA):
        plan = linear.make_plan(linear.check(*args), _H100())
        assert (plan.tma is not None) == (dtype != torch.float32)  # fp32: the pointer kernel
        ptx = _ptx(linear, *args, backend=_H100())
    assert (plan.constexprs["ACT"] == 7) == ptx_gelu
    assert ("rcp.approx.ftz.f32" in ptx and "ex2.approx.ftz.f32" in ptx) == ptx_gelu
    assert ("SFU rcp/ex2 by PTX" in plan.variant) == ptx_gelu, plan.variant
    if ptx_gelu:
        assert "div.full.f32" not in ptx and "div.rn.f32" not in ptx  # the reciprocal is the one instruction


@pytest.mark.parametrize("args", [
    (_meta(64, 4096), _meta(4096, 4096)),  # few rows
    (_meta(4096, 256), _meta(256, 4096)),  # K <= 256
    (_meta(2, 4096, 768), _meta(768, 3072)),  # batch folded into M = 8192 (BERT-base FFN up-projection)
], ids=["M=64", "K=256", "folded batch"])
def test_tma_follows_the_table_rule(args):
    """The plan uses TMA exactly when the sm90 table's first matching rule (for a TMA-eligible
    call: the ``variant: tma`` key) is a TMA config that measured no slower than the BLAS (else
    the BLAS runs: ``evidence.RULE_FLOOR``), and says which rule it took."""
    from xkernels.ops.matmul import evidence

    call = matmul.check(*args)
    plan = matmul.make_plan(call, _H100())
    M, K = call.a.shape[-2:] if call.a.dim() == 2 else (call.a.numel() // call.a.shape[-1], call.a.shape[-1])
    key = {"dtype": "bfloat16", "m": M, "n": call.b.shape[-1], "k": K, "batch": 1, "activation": "none",
           "bias": False, "variant": "tma"}
    choice = tuning.lookup("matmul", _H100(), "sm90", key, {}, rules_only=True)
    assert choice is not None and choice.measured, "the sm90 table covers these seed shapes"
    if evidence.rule_ratio(choice.record) < evidence.RULE_FLOOR:
        assert plan.config == {"VENDOR": True} and "where its kernel measured" in plan.why, plan.why
        assert plan.source == choice.source
        return
    tma = bool(choice.config.get("TMA"))
    assert bool(plan.config.get("TMA")) == tma, (plan.config, choice)
    assert ("TMA" in plan.variant) == tma
    assert plan.source == choice.source


def test_misaligned_operands_keep_the_pointer_kernel():
    odd_rows = _meta(4096, 4095)[:, :4094]  # 8190-byte rows: not 16-byte aligned
    assert "TMA" not in matmul.make_plan(matmul.check(odd_rows, _meta(4094, 4096)), _H100()).config
    odd_cols = _meta(4094, 4095)[:, :4094].t()  # M-major A whose columns are 8190 bytes apart
    assert "TMA" not in matmul.make_plan(matmul.check(odd_cols, _meta(4094, 4096)), _H100()).config


def test_m_major_a_goes_to_the_blas_unless_a_rule_names_the_layout(tmp_path):
    """No table measured an M-contiguous A (a weight gradient's grad.T): on cuda such a call
    runs cuBLAS (``m_major_a_to_vendor``), unless a config is forced or a rule names
    ``"a_layout": "m-major"``."""
    from helpers import planted_tables

    a_t, b = _meta(3072, 768).t(), _meta(3072, 1024)
    plan = matmul.make_plan(matmul.check(a_t, b), _H100())
    assert plan.vendor and plan.source == "cuda backend: m_major_a_to_vendor" and "grad.T" in plan.why
    assert not matmul.make_plan(matmul.check(_meta(768, 3072), b), _H100()).source.startswith("cuda backend")
    rule = {"when": {"a_layout": "m-major"}, "config": {**_TMA, "num_stages": 4}, "measured": {"shapes": []}}
    with planted_tables(tmp_path, "cuda", {"matmul": {"archs": {"sm90": [rule]}}}):
        planned = matmul.make_plan(matmul.check(a_t, b), _H100())
    assert not planned.vendor and planned.tma["a_mmajor"] and planned.config["num_stages"] == 4


@pytest.mark.parametrize("b_kmajor", [False, True], ids=["B row-major", "B K-major"])
def test_m_major_a_loads_its_transpose_through_tma(b_kmajor):
    """A weight gradient's ``grad.T @ x``: A is M-contiguous. The TMA kernel reads it through a
    (K, M) descriptor and feeds wgmma the transposed tile (no copy of A first)."""
    a_t = _meta(3072, 768).t()  # (M=768, K=3072), M contiguous
    b = _meta(1024, 3072).t() if b_kmajor else _meta(3072, 1024)
    with tuning.force(_TMA):
        plan, kernel = _compile(matmul, a_t, b, backend=_H100())
    assert plan.tma["a_mmajor"] and plan.tma["a"] == [64, 128] and plan.tma["b_kmajor"] == b_kmajor
    assert plan.constexprs["A_MMAJOR"] and "(K, M) transpose" in plan.variant
    ptx = kernel.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx
    assert kernel.metadata.shared <= SMEM, kernel.metadata.shared


_TMA = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "TMA": True}


def _tma_stores(ptx: str) -> int:
    return len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx))


@pytest.mark.parametrize("mode", ["one tile each", "persistent", "persistent + subtile"])
@pytest.mark.parametrize("op,args,tiles", [
    (matmul, (_meta(4096, 4096), _meta(4096, 4096)), 16 * 32),
    (linear, (_meta(4096, 4096), _meta(4096, 4096), _meta(4096), "gelu"), 16 * 32),
    (matmul, (_meta(3000, 1000), _meta(1000, 5000)), 24 * 20),
    (linear, (_meta(1024, 512), _meta(1024, 512), _meta(1024), "gelu"), 8 * 4),  # fewer tiles than SMs
], ids=["matmul 4096", "linear 4096 bias gelu", "matmul odd", "linear 1024 bias gelu"])
def test_tma_kernel_persistent_and_subtiled_epilogue(op, args, tiles, mode):
    persistent, subtile = mode != "one tile each", mode.endswith("subtile")
    cfg = {**_TMA, **({"PERSISTENT": True} if persistent else {}), **({"EPILOGUE_SUBTILE": True} if subtile else {})}
    with tuning.force(cfg):
        plan, kernel = _compile(op, *args, backend=_H100())
    assert plan.tiles == tiles and plan.grid == (min(tiles, SMS) if persistent else tiles,)
    assert plan.programs == plan.grid[0]
    assert (plan.constexprs["PERSISTENT"], plan.constexprs["EPILOGUE_SUBTILE"]) == (persistent, subtile)
    # what explain() shows
    assert plan.config.get("PERSISTENT", False) == persistent and ("persistent" in plan.variant) == persistent
    assert plan.config.get("EPILOGUE_SUBTILE", False) == subtile and ("halves" in plan.variant) == subtile
    assert plan.tma["c"] == [128, 128 if subtile else 256]
    ptx = kernel.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx
    assert ("%nctaid.x" in ptx) == persistent  # the tile loop steps by the number of programs
    assert kernel.metadata.shared <= SMEM, kernel.metadata.shared
    if subtile:  # C leaves in two TMA stores where the same kernel without subtiling has one
        with tuning.force({**cfg, "EPILOGUE_SUBTILE": False}):
            whole = _ptx(op, *args, backend=_H100())
        assert _tma_stores(ptx) == 2 * _tma_stores(whole) > 0


def test_persistent_tma_needs_a_known_sm_count():
    class _Unknown(_H100):
        def compute_units(self, device=None):
            return None

    with tuning.force({**_TMA, "PERSISTENT": True}):
        plan = matmul.make_plan(matmul.check(_meta(4096, 4096), _meta(4096, 4096)), _Unknown())
    assert plan.grid == (512,) and not plan.constexprs["PERSISTENT"] and "PERSISTENT" not in plan.config


@pytest.mark.slow
def test_tune_tma_candidates_fit_sm90_shared_memory():
    """Every TMA config ``xkernels.cli.tune`` sweeps on sm90 (the cuda tables' candidates) compiles
    for sm90 within a block's shared memory."""
    import json
    from pathlib import Path

    tables = Path(__file__).resolve().parents[3] / "ops" / "tuning" / "cuda"
    cands = {}
    for op_name in ("matmul", "linear"):
        for group in json.loads((tables / f"{op_name}.json").read_text())["candidates"]["sm90"]:
            for c in group["configs"]:
                if c.get("TMA"):
                    cfg = {k: v for k, v in c.items() if k != "cost"}
                    cands[tuple(sorted(cfg.items()))] = cfg
    assert cands
    for cfg in cands.values():
        for op, args in ((matmul, (_meta(4096, 4096), _meta(4096, 4096))),
                         (linear, (_meta(4096, 4096), _meta(4096, 4096), _meta(4096), "gelu"))):
            with tuning.force(cfg):
                plan, kernel = _compile(op, *args, backend=_H100())
            assert plan.tma is not None and kernel.metadata.shared <= SMEM, (cfg, kernel.metadata.shared)


def test_warp_specialize_reaches_the_tma_kernel():
    """``"WARP_SPECIALIZE": true`` (a forced or tuned config) becomes the kernel's constexpr and
    explain() shows it; for sm90, Triton 3.6's pass splits a 64x128, 4-warp tile into producer
    and consumer warps (setmaxnreg, more warps than asked). No table selects it: on the H100 it
    ran slower than the same tiles without it (205 vs 156 us at BERT's FFN up-projection, 2026-11-23)."""
    cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3,
           "TMA": True, "PERSISTENT": True}
    args = (_meta(2048, 768), _meta(3072, 768), _meta(3072), "gelu")
    with tuning.force({**cfg, "WARP_SPECIALIZE": True}):
        plan, kernel = _compile(linear, *args, backend=_H100())
    assert plan.constexprs["WARP_SPECIALIZE"] is True and plan.config["WARP_SPECIALIZE"] is True
    assert "warp-specialized" in plan.variant
    assert "setmaxnreg" in kernel.asm["ptx"] and kernel.metadata.num_warps > 4
    with tuning.force(cfg):
        plan, kernel = _compile(linear, *args, backend=_H100())
    assert plan.constexprs["WARP_SPECIALIZE"] is False and "WARP_SPECIALIZE" not in plan.config
    assert "setmaxnreg" not in kernel.asm["ptx"] and kernel.metadata.num_warps == 4


@pytest.mark.parametrize("mode", ["one tile each", "persistent + subtile"])
@pytest.mark.parametrize("residual", [_meta(4096, 4096), _meta(4096), _meta(4096, 8192)[:, ::2]],
                         ids=["full", "(N,)", "step-sliced"])
def test_tma_kernel_with_a_residual_compiles_for_sm90(mode, residual):
    """``linear(..., residual=r)`` on the TMA kernel: its residual entry point compiles for sm90
    with bulk tensor copies and wgmma within a block's shared memory, the residual read by the
    epilogue (global loads of it; the TMA kernel without one has none but the bias row)."""
    from xkernels.ops.matmul import kernels as K

    cfg = {**_TMA, **({"PERSISTENT": True, "EPILOGUE_SUBTILE": True} if mode != "one tile each" else {})}
    args = (_meta(4096, 4096), _meta(4096, 4096), None)
    with tuning.force(cfg):
        plan, kernel = _compile(linear, *args, backend=_H100(), residual=residual)
        plain = _ptx(linear, *args, backend=_H100())
    assert plan.jit_fn is K.matmul_tma_residual_kernel and plan.constexprs["RES"] == 1 and "residual" in plan.variant
    ptx = kernel.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx
    assert kernel.metadata.shared <= SMEM, kernel.metadata.shared
    loads = lambda text: len(re.findall(r"ld\.global", text))  # noqa: E731
    assert loads(ptx) > loads(plain) == 0, (loads(ptx), loads(plain))


def test_pointer_kernel_with_a_residual_keeps_vector_copies():
    """The pointer kernel's residual entry point at an odd shape keeps its 16-byte operand copies."""
    from xkernels.ops.matmul import kernels as K

    plan, kernel = _compile(linear, _meta(3000, 1000), _meta(5000, 1000), None, residual=_meta(3000, 5000))
    assert plan.jit_fn is K.matmul_residual_kernel and plan.constexprs["RES"] == 1
    wide, _ = _copies(kernel.asm["ptx"])
    assert wide > 0 and "wgmma.mma_async" in kernel.asm["ptx"]


def _resources(kernel) -> dict[str, int] | None:
    """ptxas's resource usage of a compiled kernel (``REG``, ``STACK``, ``LOCAL``, ``SHARED``), from
    the ``cuobjdump`` Triton ships; ``None`` where it has none."""
    import subprocess
    import tempfile
    from pathlib import Path

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = dict(re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", out))
    return {k: int(v) for k, v in found.items()} or None


def _ffn_call(m: int):
    """BERT/ViT's FFN up-projection: (m, 768) -> 3072 with bias and gelu, bf16."""
    return (_meta(m, 768), _meta(3072, 768), _meta(3072), "gelu")


@pytest.mark.parametrize("m", [4097, 8192, 12608])
def test_ffn_gelu_rule_runs_two_persistent_programs_per_sm(m):
    """The sm90 rules for gelu at 768 -> 3072 from 4097 rows (measured at 8192 and 12608 tokens:
    1.135x and 1.143x torch's F.linear + F.gelu, H100) run the persistent TMA kernel with
    ``PROGRAMS_PER_SM`` 2: a grid of twice the SMs, C stored in halves, the fast erf (its PTX form).
    Compiled for sm90, a program's shared memory and registers let two reside on an SM, and nothing
    spills."""
    from xkernels.ops.matmul.plan import GELU_FAST_ERF_PTX

    plan = linear.make_plan(linear.check(*_ffn_call(m)), _H100())
    tiles = (m + 127) // 128 * 24
    assert "linear.json [sm90] rule" in plan.source and plan.measured, (plan.source, plan.why)
    assert plan.config.get("PROGRAMS_PER_SM") == 2 and plan.config.get("PERSISTENT") is True, plan.config
    assert plan.tiles == tiles and plan.grid == (2 * SMS,) and plan.programs == 2 * SMS < tiles
    assert plan.constexprs["PERSISTENT"] and plan.constexprs["EPILOGUE_SUBTILE"]
    assert plan.constexprs["ACT"] == GELU_FAST_ERF_PTX and "gelu (fast erf, SFU rcp/ex2 by PTX)" in plan.variant
    assert "2 programs per SM" in plan.variant and plan.tma["c"] == [128, 64]
    with tuning.force(plan.config):
        forced, kernel = _compile(linear, *_ffn_call(m), backend=_H100())
    assert forced.grid == plan.grid and forced.constexprs == plan.constexprs
    ptx = kernel.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx and "%nctaid.x" in ptx
    assert "erf" not in ptx  # libdevice's erff is gone from the epilogue
    # two resident programs per SM: each one's shared memory plus the driver's reserve, twice
    assert 2 * (kernel.metadata.shared + BLOCK_RESERVED) <= SM_SMEM, kernel.metadata.shared
    assert not re.search(r"\b(ld|st)\.local\b", ptx)  # no local-memory arrays in the PTX
    res = _resources(kernel)
    if res is not None:  # ptxas's verdict: no spills, registers for two programs of 8 warps
        assert res.get("LOCAL", 0) == 0 and res.get("STACK", 0) == 0, res
        assert 2 * res["REG"] * 32 * kernel.metadata.num_warps <= SM_REGS, res


def test_ffn_gelu_rule_with_more_stages_would_not_fit_two_programs():
    """The contrast that makes the shared-memory check above meaningful: a fourth stage (another
    32 KiB of A and B tiles) leaves room for one program per SM only."""
    plan = linear.make_plan(linear.check(*_ffn_call(8192)), _H100())
    with tuning.force({**plan.config, "num_stages": 4}):
        _, kernel = _compile(linear, *_ffn_call(8192), backend=_H100())
    assert 2 * (kernel.metadata.shared + BLOCK_RESERVED) > SM_SMEM, kernel.metadata.shared


@pytest.mark.parametrize("m", [8192, 12608])
def test_the_training_forward_stores_the_pre_activation_and_still_fits_two_programs(m):
    """``matmul_tma_pre_kernel`` (training's fused forward, ``ops/matmul/pre_activation.py``) on the
    FFN rule's plan: twice the plain kernel's tensor-descriptor stores (h and act(h), each in two
    halves), and the staging buffers reused, so two programs still reside on an SM and nothing spills."""
    from xkernels.ops.matmul import kernels as K

    plan = linear.make_plan(linear.check(*_ffn_call(m)), _H100())
    with tuning.force(plan.config):
        _, plain = _compile(linear, *_ffn_call(m), backend=_H100())
    desc = lambda block: f"tensordesc<bf16{list(block)}>"  # noqa: E731
    sig = {"a_desc": desc(plan.tma["a"]), "b_desc": desc(plan.tma["b"]), "c_desc": desc(plan.tma["c"]),
           "h_desc": desc(plan.tma["c"]), "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "slope": "fp32",
           **{n: "constexpr" for n in K.matmul_tma_pre_kernel.arg_names[9:]}}
    attrs = {(4,): [["tt.divisibility", 16]], (6,): [["tt.divisibility", 16]], (7,): [["tt.divisibility", 16]]}
    opts = {k: v for k, v in plan.options.items() if k in ("num_warps", "num_stages")}
    kernel = triton.compile(ASTSource(K.matmul_tma_pre_kernel, sig, dict(plan.constexprs), attrs),
                            target=GPUTarget("cuda", 90, 32), options=opts)
    ptx = kernel.asm["ptx"]
    assert _tma_stores(ptx) == 2 * _tma_stores(plain.asm["ptx"]) > 0
    assert "rcp.approx.ftz.f32" in ptx and "wgmma.mma_async" in ptx
    assert 2 * (kernel.metadata.shared + BLOCK_RESERVED) <= SM_SMEM, kernel.metadata.shared
    res = _resources(kernel)
    if res is not None:
        assert res.get("LOCAL", 0) == 0 and res.get("STACK", 0) == 0, res
        assert 2 * res["REG"] * 32 * kernel.metadata.num_warps <= SM_REGS, res


@pytest.mark.parametrize("grad", ["gelu", "quick_gelu", "relu2"])
@pytest.mark.parametrize("m", [8192, 12608])
def test_the_training_backward_applies_the_derivative_and_keeps_two_programs_resident(m, grad):
    """``matmul_tma_act_grad_kernel`` (training's feed-forward backward, ``ops/matmul/feed_forward.py``)
    on the FFN rule's plan with ``resident_options``: H's tile loaded through a tensor descriptor,
    the SFU's reciprocal and exponential (gelu's derivative; quick_gelu's and relu2's have their own), wgmma; one
    stage fewer and at most 128 registers keep two programs on an SM with nothing spilled, where the
    plan's own 3 stages would not."""
    from xkernels.ops.matmul import feed_forward
    from xkernels.ops.matmul import kernels as K

    plan = linear.make_plan(linear.check(*_ffn_call(m)), _H100())
    options = feed_forward.resident_options(plan, _H100(), torch.device("meta"))
    assert options == {"num_warps": 8, "num_stages": 2, "maxnreg": 128}, options
    bm, bn, bk = (plan.constexprs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    desc = lambda block: f"tensordesc<bf16{list(block)}>"  # noqa: E731
    sig = {"a_desc": desc([bm, bk]), "b_desc": desc([bk, bn]), "c_desc": desc(plan.tma["c"]),
           "h_desc": desc(plan.tma["c"]), "dbias_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "slope": "fp32",
           **{n: "constexpr" for n in K.matmul_tma_act_grad_kernel.arg_names[9:]}}
    code = plan.constexprs["ACT"] if grad == "gelu" else ACTIVATIONS[grad]  # the FFN rule's plan, another derivative
    constexprs = {**{k: plan.constexprs[k] for k in feed_forward._SHARED}, "B_KMAJOR": False,
                  "GRAD": code, "DBIAS": True}
    attrs = {(4,): [["tt.divisibility", 16]], (6,): [["tt.divisibility", 16]], (7,): [["tt.divisibility", 16]]}
    kernels = {}
    for name, opts in (("resident", options), ("plan", dict(plan.options))):
        kernels[name] = triton.compile(ASTSource(K.matmul_tma_act_grad_kernel, sig, constexprs, attrs),
                                       target=GPUTarget("cuda", 90, 32), options=opts)
    kernel = kernels["resident"]
    ptx = kernel.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx
    assert ("rcp.approx.ftz.f32" in ptx and "ex2.approx.ftz.f32" in ptx) == (grad == "gelu")
    assert ".maxnreg 128" in ptx
    assert 2 * (kernel.metadata.shared + BLOCK_RESERVED) <= SM_SMEM, kernel.metadata.shared
    assert 2 * (kernels["plan"].metadata.shared + BLOCK_RESERVED) > SM_SMEM, kernels["plan"].metadata.shared
    res = _resources(kernel)
    if res is not None:
        # residency is the property (registers for two programs, no local arrays); no stack at all
        # on the Triton measured (3.6, results/2026-11-27-h100-feed-forward-backward), where
        # Triton 3.9 under the same 128-register cap keeps a stack frame of 8 bytes (gelu's
        # derivative) to 24 (quick_gelu's)
        stack = 0 if triton.__version__.startswith("3.6.") else 32
        assert res.get("LOCAL", 0) == 0 and res.get("STACK", 0) <= stack, res
        assert 2 * res["REG"] * 32 * kernel.metadata.num_warps <= SM_REGS, res


@pytest.mark.parametrize("units", [132, 114, 78, 16])
@pytest.mark.parametrize("per_sm", [None, 1, 2, 3])
def test_persistent_programs_follow_the_backends_compute_units(units, per_sm):
    """A persistent TMA plan launches ``min(tiles, compute units x PROGRAMS_PER_SM)`` programs, the
    units from the backend (an H100 SXM's 132 SMs, a PCIe card's 114, ...), never a fixed count;
    explain() names the knob where it is above 1."""

    class _Part(_H100):
        def compute_units(self, device=None):
            return units

    cfg = {**_TMA, "BLOCK_N": 128, "PERSISTENT": True, **({"PROGRAMS_PER_SM": per_sm} if per_sm else {})}
    n = per_sm or 1
    for m, tiles in ((8192, 64 * 24), (512, 4 * 24)):
        with tuning.force(cfg):
            plan = linear.make_plan(linear.check(*_ffn_call(m)), _Part())
        assert plan.tiles == tiles and plan.grid == (min(tiles, units * n),) and plan.programs == plan.grid[0]
        assert plan.constexprs["PERSISTENT"] is True
        assert plan.config.get("PROGRAMS_PER_SM") == (n if n > 1 else None), plan.config
        assert (f"{n} programs per SM" in plan.variant) == (n > 1), plan.variant
    with tuning.force({**cfg, "PERSISTENT": False}):  # the knob means nothing without a persistent loop
        plan = linear.make_plan(linear.check(*_ffn_call(8192)), _Part())
    assert plan.grid == (64 * 24,) and "PROGRAMS_PER_SM" not in plan.config


def test_programs_per_sm_is_dropped_with_tma_and_named_in_labels():
    """A forced TMA config on a call that cannot load through tensor descriptors runs the pointer
    kernel without the TMA-only keys; the wave model's labels name the knob."""
    from xkernels.ops.matmul import config as mc

    cfg = {**_TMA, "BLOCK_N": 128, "PERSISTENT": True, "PROGRAMS_PER_SM": 2, "EPILOGUE_SUBTILE": True}
    odd_rows = _meta(4096, 4095)[:, :4094]  # 8190-byte rows: not 16-byte aligned
    with tuning.force(cfg):
        plan = matmul.make_plan(matmul.check(odd_rows, _meta(4094, 4096)), _H100())
    assert plan.tma is None and not set(mc.TMA_ONLY) & set(plan.config), plan.config
    assert mc._label(cfg).endswith("+tma+persistent+epilogue_subtile+x2_per_sm")
    assert "per_sm" not in mc._label({**cfg, "PROGRAMS_PER_SM": 1})
