"""Can a fused Triton GEMM + exact (erf) GELU reach 1.2x torch's ``F.gelu(F.linear(x, W, b))`` at
BERT/ViT's FFN up-projection (K 768 -> N 3072) on an H100 in bf16?

Question: the best table config (128x128x64 TMA tiles, 3 stages, one tile per program) measured
~1.04x torch at 8192 tokens (99.4 vs 103.2 us, ~390 TFLOP/s; results/2026-11-23-h100-ffn-tiles),
while the same tiles with silu reach ~1.15x: the erf epilogue costs about 10%. cuBLAS alone takes
~60-65 us and the separate gelu pass ~35 us, so 1.2x needs ~470 TFLOP/s including the epilogue.
Prediction: two levers close most of the gap: (1) a cheaper erf (Abramowitz & Stegun 7.1.26,
|error| <= 1.5e-7, one exp and one approximate reciprocal, against libdevice's erff), and (2)
hiding the epilogue behind another tile's main loop: two resident programs per SM (128x128 tiles,
<= 3 stages: the pipeline buffers are reused for C's staging) or Hopper warp specialization
(``tl.range(..., warp_specialize=True)``, Triton 3.6's sm90 pass) on a persistent 128x256 tile.

Per shape (BERT 8192 and ViT 64x197 = 12608 and 2048 tokens with gelu; Llama's 2048 x 4096 ->
14336 with silu as a second check), the probe times torch unfused, torch's ``F.linear`` alone
(cuBLAS), xkernels' ``linear(..., activation=...)`` as routed today (its ``linear.explain`` is
printed), the package's TMA kernel under forced configs, and this file's own persistent / one-tile
TMA kernel (``ffn_gemm_kernel``) under a bounded list of configs. Every candidate is first checked
against a float64 reference on fresh random inputs (sampled rows, NaN-filled output for the
probe's kernel); one that fails to compile or check is a row with its error, not the end.
Timing: ``triton.testing.do_bench`` (L2 flushed before each call, median), in ``--rounds`` rounds
whose order alternates (forward, reversed, ...); a row gives the median of the round medians and
their min-max. Output: a table and ``$OUT/ffn-fast-gemm.json`` (the cwd without ``OUT``).

Candidate labels: ``1tile`` one program per tile, ``flat`` persistent with the flattened loop,
``ws`` persistent and warp-specialized; ``sub<S>`` C stored in S column slices; ``x2`` two
persistent programs per SM; ``erf`` libdevice's erff, ``fast`` the A&S erf, ``lean`` the
same with its constants folded and the SFU reciprocal / exponential by inline PTX (the package's ``ACT`` 7).

    python tools/probes/ffn_fast_gemm.py                      # the GPU run (< 6 min on an H100)
    python tools/probes/ffn_fast_gemm.py --compile-only       # CPU: compile every candidate for sm90
    python tools/probes/ffn_fast_gemm.py --tiny               # CPU: the checks under TRITON_INTERPRET=1
"""

from __future__ import annotations

import os
import sys

if "--tiny" in sys.argv:  # must precede the first import of triton: jit functions read it at decoration
    os.environ["TRITON_INTERPRET"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# (M, K, N, activation): BERT-base 16 x 512 tokens, ViT-B/16 64 x 197, 2048 tokens; Llama-ish with silu
SHAPES = [(8192, 768, 3072, "gelu"), (12608, 768, 3072, "gelu"), (2048, 768, 3072, "gelu"),
          (2048, 4096, 14336, "silu")]
TINY_SHAPES = [(300, 96, 320, "gelu"), (300, 96, 320, "silu")]

ACT_CODE = {"gelu": 2, "silu": 3, "gelu_fast": 6, "gelu_lean": 7}


# --------------------------------------------------------------------------------------------
# the probe's own kernel
# --------------------------------------------------------------------------------------------

@triton.jit
def _act(x, ACT: tl.constexpr):
    if ACT == 2:  # F.gelu: 0.5 x (1 + erf(x / sqrt 2)), libdevice erff
        x = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACT == 3:
        x = x / (1.0 + tl.exp(-x))
    elif ACT == 6:  # the same GELU, erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7)
        z = tl.abs(x) * 0.7071067811865476
        t = tl.fdiv(tl.full(z.shape, 1.0, tl.float32), 1.0 + 0.3275911 * z, ieee_rounding=False)
        p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        q = 0.5 * p * tl.exp(-z * z)  # 0.5 erfc(|x| / sqrt 2): no cancellation for negative x
        x = x * tl.where(x >= 0, 1.0 - q, q)
    elif ACT == 7:  # ACT 6 with its constants folded and the flush-to-zero approximate rcp / ex2
        t = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + 0.2316418882663604 * tl.abs(x)],
                                      dtype=tl.float32, is_pure=True, pack=1)
        p = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * x * -0.7213475204444817],
                                      dtype=tl.float32, is_pure=True, pack=1)
        q = p * e  # 0.5 erfc(|x| / sqrt 2)
        x = x * tl.where(x >= 0, 1.0 - q, q)
    return x


@triton.jit
def _tile(tile, tiles_m, tiles_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    width = GROUP_M * tiles_n
    first_m = (tile // width) * GROUP_M
    group = tl.minimum(tiles_m - first_m, GROUP_M)
    return (first_m + (tile % width) % group) * BLOCK_M, ((tile % width) // group) * BLOCK_N


@triton.jit
def _store(c_desc, c_ptr, bias_ptr, acc, off_m, off_n, M, N, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr,
           HAS_BIAS: tl.constexpr, ACT: tl.constexpr, STORE_PTR: tl.constexpr):
    rn = off_n + tl.arange(0, WIDTH)
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    acc = _act(acc, ACT)
    if STORE_PTR:  # pointer stores: sm90 warp specialization splits a 128-row tile over two consumer
        # warp groups, which a (128, W) descriptor store does not survive (Triton 3.6)
        rm = off_m + tl.arange(0, BLOCK_M)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=(rm < M)[:, None] & (rn < N)[None, :])
    else:
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


@triton.jit
def _halves(acc, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr):
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, WIDTH // 2)), (0, 2, 1)))


@triton.jit
def _epilogue(c_desc, c_ptr, bias_ptr, acc, off_m, off_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              EPI_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, STORE_PTR: tl.constexpr):
    if EPI_SPLIT == 1:
        _store(c_desc, c_ptr, bias_ptr, acc, off_m, off_n, M, N, BLOCK_M, BLOCK_N, HAS_BIAS, ACT, STORE_PTR)
    elif EPI_SPLIT == 2:
        H: tl.constexpr = BLOCK_N // 2
        a0, a1 = _halves(acc, BLOCK_M, BLOCK_N)
        _store(c_desc, c_ptr, bias_ptr, a0, off_m, off_n, M, N, BLOCK_M, H, HAS_BIAS, ACT, STORE_PTR)
        _store(c_desc, c_ptr, bias_ptr, a1, off_m, off_n + H, M, N, BLOCK_M, H, HAS_BIAS, ACT, STORE_PTR)
    else:  # 4 column quarters
        Q: tl.constexpr = BLOCK_N // 4
        a0, a1 = _halves(acc, BLOCK_M, BLOCK_N)
        q0, q1 = _halves(a0, BLOCK_M, BLOCK_N // 2)
        _store(c_desc, c_ptr, bias_ptr, q0, off_m, off_n, M, N, BLOCK_M, Q, HAS_BIAS, ACT, STORE_PTR)
        _store(c_desc, c_ptr, bias_ptr, q1, off_m, off_n + Q, M, N, BLOCK_M, Q, HAS_BIAS, ACT, STORE_PTR)
        q2, q3 = _halves(a1, BLOCK_M, BLOCK_N // 2)
        _store(c_desc, c_ptr, bias_ptr, q2, off_m, off_n + 2 * Q, M, N, BLOCK_M, Q, HAS_BIAS, ACT, STORE_PTR)
        _store(c_desc, c_ptr, bias_ptr, q3, off_m, off_n + 3 * Q, M, N, BLOCK_M, Q, HAS_BIAS, ACT, STORE_PTR)


@triton.jit
def ffn_gemm_kernel(a_desc, b_desc, c_desc, c_ptr, bias_ptr, M, N, K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, EPI_SPLIT: tl.constexpr, PERSISTENT: tl.constexpr,
                    WS: tl.constexpr, UPCAST: tl.constexpr, STORE_PTR: tl.constexpr):
    """C = act(A @ W^T + bias): A (M, K), W (N, K) (linear's weight, K-contiguous), C (M, N), all
    through host tensor descriptors (C's block is (BLOCK_M, BLOCK_N // EPI_SPLIT)). ``PERSISTENT``:
    programs walk tiles pid, pid + nprog, ... (flattened loop, or warp-specialized with ``WS``)."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if PERSISTENT:
        nprog = tl.num_programs(0)
        tile_c = pid - nprog
        for tile in tl.range(pid, tiles_m * tiles_n, nprog, flatten=not WS, warp_specialize=WS):
            off_m, off_n = _tile(tile, tiles_m, tiles_n, BLOCK_M, BLOCK_N, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a = a_desc.load([off_m, ki * BLOCK_K])
                b = b_desc.load([off_n, ki * BLOCK_K])
                if UPCAST:  # the interpreter's dot reads bfloat16 as raw uint16
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, b.T, acc)
            # the epilogue recounts its tile (as Triton's persistent-matmul tutorial does)
            tile_c += nprog
            off_cm, off_cn = _tile(tile_c, tiles_m, tiles_n, BLOCK_M, BLOCK_N, GROUP_M)
            _epilogue(c_desc, c_ptr, bias_ptr, acc, off_cm, off_cn, M, N, BLOCK_M, BLOCK_N, EPI_SPLIT, HAS_BIAS, ACT,
                      STORE_PTR)
    else:
        off_m, off_n = _tile(pid, tiles_m, tiles_n, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = b_desc.load([off_n, ki * BLOCK_K])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b.T, acc)
        _epilogue(c_desc, c_ptr, bias_ptr, acc, off_m, off_n, M, N, BLOCK_M, BLOCK_N, EPI_SPLIT, HAS_BIAS, ACT,
                  STORE_PTR)


# --------------------------------------------------------------------------------------------
# candidates
# --------------------------------------------------------------------------------------------

def _own(bm, bn, stages, mode="1tile", split=1, erf="fast", warps=8, per_sm=1, bk=64, group=8, store="tma"):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_warps": warps,
            "num_stages": stages, "mode": mode, "EPI_SPLIT": split, "erf": erf, "per_sm": per_sm, "store": store}


def _own_name(c):
    sub = f" sub{c['EPI_SPLIT']}" if c["EPI_SPLIT"] > 1 else ""
    x = f" x{c['per_sm']}" if c["per_sm"] > 1 else ""
    w = f" w{c['num_warps']}" if c["num_warps"] != 8 else ""
    w += f" g{c['GROUP_M']}" if c["GROUP_M"] != 8 else ""
    st = " ptr-store" if c["store"] == "ptr" else ""
    return f"{c['mode']} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} s{c['num_stages']}{sub}{x}{w}{st} {c['erf']}"


#: the probe's kernel, in the order they run (bounded: each costs a compile per activation)
OWN = [
    _own(128, 128, 3, erf="erf"),                   # the table's config in this kernel: the control
    _own(128, 128, 3),                              # the same with the A&S erf: what erff costs
    _own(128, 128, 3, split=2),                     # half the C staging buffer, fewer live registers
    _own(128, 128, 3, mode="flat", split=2, per_sm=2),  # persistent, two programs per SM (115 KB each)
    _own(128, 128, 3, mode="flat", split=2, per_sm=2, erf="lean"),  # the same, folded constants, ftz rcp/ex2
    _own(128, 128, 3, mode="flat", split=4, per_sm=2, erf="lean"),
    # sm90 warp specialization: 4 warps asked, Triton 3.6 adds a producer and splits the tile's rows
    # over two consumer warp groups (12 warps); C leaves through pointer stores (see _store)
    _own(128, 256, 3, mode="ws", warps=4, store="ptr", erf="erf"),
    _own(128, 256, 3, mode="ws", warps=4, store="ptr"),
    _own(128, 128, 3, mode="ws", warps=4, store="ptr"),
    _own(128, 128, 4, mode="ws", warps=4, store="ptr"),
    _own(128, 256, 4, mode="flat", split=4),        # persistent, flattened, deep pipeline, one program per SM
    # around the best so far (flat 128x128x64 s3 sub2 x2): pipeline depth, C slices, tile order, K step
    _own(128, 128, 2, mode="flat", split=2, per_sm=2),
    _own(128, 128, 4, mode="flat", split=2),
    _own(128, 128, 3, mode="flat", split=4, per_sm=2),
    _own(128, 128, 3, mode="flat", split=2, per_sm=2, group=16),
    _own(128, 128, 2, mode="flat", split=2, bk=128),
    _own(128, 64, 4, mode="flat", per_sm=2, warps=4),
    _own(64, 256, 2, mode="flat", split=2, per_sm=2, warps=4),
]
_TMA = {"BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "TMA": True}
#: the package's TMA kernel (ops/matmul/kernels.py) under forced configs
PKG = [
    ("pkg 128x128x64 s3 sub2", {**_TMA, "BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 3, "EPILOGUE_SUBTILE": True}),
]


def _own_act(cfg, act):
    if act == "gelu" and cfg["erf"] in ("fast", "lean"):
        return ACT_CODE["gelu_" + cfg["erf"]]
    return ACT_CODE[act]


def _own_key(cfg, act):
    """Configs that compile to the same kernel for ``act`` (silu ignores the erf choice)."""
    return tuple((k, v) for k, v in sorted(cfg.items()) if k != "erf") + (("ACT", _own_act(cfg, act)),)


def _own_constexprs(cfg, act, has_bias=True):
    return dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
                HAS_BIAS=has_bias, ACT=_own_act(cfg, act), EPI_SPLIT=cfg["EPI_SPLIT"],
                PERSISTENT=cfg["mode"] != "1tile", WS=cfg["mode"] == "ws", UPCAST=INTERPRET,
                STORE_PTR=cfg["store"] == "ptr")


def own_runner(cfg, act, x, w, b, out, sms):
    """A closure launching the probe's kernel on fixed operands (descriptors built once)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = x.shape
    N = w.shape[0]
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    a_d = TensorDescriptor.from_tensor(x, [bm, bk])
    b_d = TensorDescriptor.from_tensor(w, [bn, bk])
    c_d = TensorDescriptor.from_tensor(out, [bm, bn // cfg["EPI_SPLIT"]])
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    grid = (min(tiles, sms * cfg["per_sm"]),) if cfg["mode"] != "1tile" else (tiles,)
    consts = _own_constexprs(cfg, act, b is not None)
    opts = {} if INTERPRET else {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    bias = b if b is not None else out

    def run():
        return ffn_gemm_kernel[grid](a_d, b_d, c_d, out, bias, M, N, K, **consts, **opts)

    return run


# --------------------------------------------------------------------------------------------
# compile for a fake sm90 on the CPU (as tests/ops/matmul/test_codegen.py does)
# --------------------------------------------------------------------------------------------

def _resources(cubin: bytes) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        r = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True)
    m = re.search(r"REG:(\d+).*?SHARED:(\d+)", r.stdout)
    return f"regs {m.group(1)}" if m else ""


def _sm90_compile(fn, sig, consts, opts):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, s) in enumerate(sig.items()) if s.startswith("*")}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)


def _describe(kernel) -> str:
    ptx = kernel.asm["ptx"]
    ws = "setmaxnreg" in ptx
    return (f"warps {kernel.metadata.num_warps}, smem {kernel.metadata.shared} B, "
            f"wgmma {len(re.findall(r'wgmma.mma_async', ptx))}, tma-stores "
            f"{len(re.findall(r'cp.async.bulk.tensor.[0-9]d.global.shared', ptx))}, "
            f"{'warp-specialized (setmaxnreg)' if ws else 'not warp-specialized'}, {_resources(kernel.asm['cubin'])}")


def compile_only(acts) -> int:
    """Compile each of the probe's candidates and the package's forced configs for sm90 (no GPU)."""
    from xkernels import tuning
    from xkernels.backends.cuda import CudaBackend
    from xkernels.ops import linear

    class _H100(CudaBackend):
        def arch(self, device=None):
            return "sm90"

        def max_programs(self, unit="vector", device=None):
            return 2**31 - 1

        def compute_units(self, device=None):
            return 132

    failures = 0
    seen = set()
    for act in acts:
        for cfg in OWN:
            if _own_key(cfg, act) in seen:
                continue
            seen.add(_own_key(cfg, act))
            bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
            sig = {"a_desc": f"tensordesc<bf16[{bm}, {bk}]>", "b_desc": f"tensordesc<bf16[{bn}, {bk}]>",
                   "c_desc": f"tensordesc<bf16[{bm}, {bn // cfg['EPI_SPLIT']}]>", "c_ptr": "*bf16", "bias_ptr": "*bf16",
                   "M": "i32", "N": "i32", "K": "i32"}
            consts = {**_own_constexprs(cfg, act), "UPCAST": False}
            sig.update({k: "constexpr" for k in consts})
            t0 = time.perf_counter()
            try:
                k = _sm90_compile(ffn_gemm_kernel, sig, consts,
                                  {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
                print(f"{act:5} {_own_name(cfg):40} ok {time.perf_counter() - t0:5.1f}s  {_describe(k)}", flush=True)
            except Exception as exc:  # noqa: BLE001 - report and go on
                failures += 1
                print(f"{act:5} {_own_name(cfg):40} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        for name, cfg in PKG:
            meta = lambda *s: torch.empty(s, dtype=torch.bfloat16, device="meta")  # noqa: E731
            call = linear.check(meta(8192, 768), meta(3072, 768), meta(3072), act)
            t0 = time.perf_counter()
            try:
                with tuning.force(cfg):
                    plan = linear.make_plan(call, _H100())
                c = meta(8192, 3072)
                rt = plan.args(call.a, call.b, c, call.bias, call.slope, call.residual)
                sig, consts = {}, dict(plan.constexprs)
                for n, v in zip(plan.jit_fn.arg_names, rt):
                    if type(v).__name__ == "TensorDescriptor":
                        sig[n] = f"tensordesc<bf16{list(v.block_shape)}>"
                    elif isinstance(v, torch.Tensor):
                        sig[n] = "*bf16"
                    elif isinstance(v, float):
                        sig[n] = "fp32"
                    elif v == 1:
                        sig[n], consts[n] = "constexpr", 1
                    else:
                        sig[n] = "i32"
                for n in plan.jit_fn.arg_names[len(rt):]:
                    sig[n] = "constexpr"
                opts = {k: v for k, v in plan.options.items() if k in ("num_warps", "num_stages")}
                k = _sm90_compile(plan.jit_fn, sig, consts, opts)
                print(f"{act:5} {name:40} ok {time.perf_counter() - t0:5.1f}s  {_describe(k)}  [{plan.variant}]",
                      flush=True)
            except Exception as exc:  # noqa: BLE001
                failures += 1
                print(f"{act:5} {name:40} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    return failures


# --------------------------------------------------------------------------------------------
# checks and timing
# --------------------------------------------------------------------------------------------

def _ref_rows(x, w, b, act, rows):
    y = x[rows].double() @ w.double().T + b.double()
    return F.gelu(y) if act == "gelu" else F.silu(y)


def _inputs(M, K, N, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, device=device, dtype=torch.float32, generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, device=device, dtype=torch.float32, generator=g) / K**0.5).to(torch.bfloat16)
    b = (0.5 * torch.randn(N, device=device, dtype=torch.float32, generator=g)).to(torch.bfloat16)
    return x, w, b


def _check_rows(M, device, seed):
    """First and last 128 rows (edge tiles) and 512 random ones."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = torch.cat([torch.arange(min(M, 128)), torch.arange(max(0, M - 128), M), torch.randint(0, M, (512,), generator=g)])
    return rows.unique().to(device)


def torch_unfused(x, w, b, act):
    y = F.linear(x, w, b)
    return F.gelu(y) if act == "gelu" else F.silu(y)


def check(make_fn, M, K, N, act, device, seed, torch_err=None):
    """(max |err| / max |ref| on sampled rows, finite) of the callable ``make_fn(x, w, b)`` returns
    (its result, or None when it wrote into the NaN-filled ``out`` it was given)."""
    x, w, b = _inputs(M, K, N, device, seed)
    out = torch.full((M, N), float("nan"), device=device, dtype=torch.bfloat16)
    got = make_fn(x, w, b, out)()
    got = out if got is None or not isinstance(got, torch.Tensor) else got
    rows = _check_rows(M, device, seed)
    ref = _ref_rows(x, w, b, act, rows)
    err = (got[rows].double() - ref).abs().max().item() / ref.abs().max().item()
    finite = bool(torch.isfinite(got).all().item())
    return err, finite


def bench_ms(fn, device) -> float:
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    t = []
    for _ in range(2):
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)


def _short(exc) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {(lines[-1] if lines else '')[:240]}"


def run_shape(M, K, N, act, device, sms, args, t_start, entries_out):
    from xkernels import tuning
    from xkernels.ops import linear

    flops = 2.0 * M * N * K
    x, w, b = _inputs(M, K, N, device, seed=1000 + M)
    rows = []  # dicts: name, kind, config, fn, ...

    def add(name, kind, config, make_fn, check_it=True):
        """Compile (first call), check, and register a timed callable built by make_fn(x, w, b, out)."""
        row = {"name": name, "kind": kind, "config": config, "ok": False}
        if time.perf_counter() - t_start > args.budget_s:
            row["error"] = f"skipped: past the --budget-s {args.budget_s} s"
            print(f"  {name:44} {row['error']}", flush=True)
            rows.append(row)
            return
        try:
            t0 = time.perf_counter()
            out = torch.empty((M, N), device=device, dtype=torch.bfloat16)
            fn = make_fn(x, w, b, out)
            handle = fn()  # compiles
            if device.type == "cuda":
                torch.cuda.synchronize()
            row["compile_s"] = round(time.perf_counter() - t0, 2)
            if hasattr(handle, "n_regs"):
                row["n_regs"], row["n_spills"] = handle.n_regs, handle.n_spills
                row["shared"] = handle.metadata.shared
                row["num_warps"] = handle.metadata.num_warps
            if check_it:
                err, finite = check(make_fn, M, K, N, act, device, seed=len(rows) + 7 * M)
                row["err"], row["finite"] = err, finite
                limit = 2 * args.torch_err + 1e-3
                if not finite or not err <= limit:
                    row["error"] = f"check failed: max|err|/max|ref| {err:.2e} (limit {limit:.2e}), finite {finite}"
                    print(f"  {name:44} {row['error']}", flush=True)
                    rows.append(row)
                    return
            row["ok"], row["fn"] = True, fn
            extra = f" regs {row['n_regs']} spills {row['n_spills']} smem {row['shared']}" if "n_regs" in row else ""
            print(f"  {name:44} ok: compile+first {row['compile_s']:.1f}s, err {row.get('err', 0):.2e}{extra}",
                  flush=True)
        except Exception as exc:  # noqa: BLE001 - a candidate that fails is a row, not the end
            row["error"] = _short(exc)
            print(f"  {name:44} FAILED {row['error']}", flush=True)
        rows.append(row)

    # the torch baselines; torch's own error sets the check's scale
    err_t, _ = check(lambda x, w, b, out: (lambda: torch_unfused(x, w, b, act)), M, K, N, act, device, seed=3)
    args.torch_err = err_t
    print(f"  torch unfused max|err|/max|ref| {err_t:.2e} (bf16 result of a bf16 linear)", flush=True)
    add(f"torch F.linear + F.{act}", "torch", None, lambda x, w, b, out: (lambda: torch_unfused(x, w, b, act)),
        check_it=False)
    add("torch F.linear (cuBLAS alone)", "cublas", None, lambda x, w, b, out: (lambda: F.linear(x, w, b)),
        check_it=False)
    # xkernels as routed today
    try:
        print("  linear.explain:\n    " + str(linear.explain(x, w, b, act)).replace("\n", "\n    "), flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"  linear.explain failed: {_short(exc)}", flush=True)
    add("xkernels linear (route)", "route", None, lambda x, w, b, out: (lambda: linear(x, w, b, act)))

    def forced(cfg):
        def make(x, w, b, out):
            def run():
                with tuning.force(cfg):
                    return linear(x, w, b, act)
            return run
        return make

    if not args.no_package:
        for name, cfg in PKG:
            add(name, "package", cfg, forced(cfg))
    seen = set()
    for cfg in OWN:
        if args.only and not any(s in _own_name(cfg) for s in args.only.split(",")):
            continue
        if _own_key(cfg, act) in seen:
            continue
        seen.add(_own_key(cfg, act))
        add(_own_name(cfg) if act == "gelu" else _own_name(cfg).rsplit(" ", 1)[0], "own", cfg,
            lambda x, w, b, out, cfg=cfg: own_runner(cfg, act, x, w, b, out, sms))

    live = [r for r in rows if r["ok"]]
    for rnd in range(args.rounds):
        for r in (live if rnd % 2 == 0 else live[::-1]):
            try:
                r.setdefault("ms_rounds", []).append(bench_ms(r["fn"], device))
            except Exception as exc:  # noqa: BLE001
                r["ok"], r["error"] = False, "timing: " + _short(exc)
        live = [r for r in live if r["ok"]]
    base = {r["kind"]: statistics.median(r["ms_rounds"]) for r in rows if r["kind"] in ("torch", "cublas") and r["ok"]}
    print(f"\n  {'M x K -> N act':24} {'candidate':44} {'us median [min-max]':>26} {'TFLOP/s':>8} "
          f"{'vs torch':>8} {'vs cuBLAS':>9}")
    for r in rows:
        r.pop("fn", None)
        label = f"{M}x{K}->{N} {act}"
        if not r.get("ms_rounds"):
            print(f"  {label:24} {r['name']:44} {r.get('error', 'not timed')}")
            continue
        ms = r["ms_rounds"]
        med = statistics.median(ms)
        r["us_median"], r["us_min"], r["us_max"] = med * 1e3, min(ms) * 1e3, max(ms) * 1e3
        r["tflops"] = flops / (med * 1e-3) / 1e12
        r["vs_torch"] = base["torch"] / med if "torch" in base else None
        r["vs_cublas"] = base["cublas"] / med if "cublas" in base else None
        span = f"{r['us_median']:.1f} [{r['us_min']:.1f}-{r['us_max']:.1f}]"
        vt = f"{r['vs_torch']:.3f}" if r["vs_torch"] else "-"
        vc = f"{r['vs_cublas']:.3f}" if r["vs_cublas"] else "-"
        print(f"  {label:24} {r['name']:44} {span:>26} {r['tflops']:8.1f} {vt:>8} {vc:>9}")
    entries_out.append({"M": M, "K": K, "N": N, "activation": act, "torch_err": err_t, "rows": rows})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=None,
                    help="M:K:N:act,... (default: 8192/12608/2048 x 768 -> 3072 gelu, 2048 x 4096 -> 14336 silu)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (order alternates)")
    ap.add_argument("--only", default=None, help="comma-separated substrings: run only the probe's configs "
                    "whose label contains one")
    ap.add_argument("--no-package", action="store_true", help="skip the package's forced configs")
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="skip candidates not yet compiled after this many seconds (the run stays < 6 min)")
    ap.add_argument("--compile-only", action="store_true",
                    help="(CPU) compile every candidate for a fake sm90 and report warps, shared memory, "
                    "registers, warp specialization; no device needed")
    ap.add_argument("--tiny", action="store_true",
                    help="(CPU) a tiny shape under TRITON_INTERPRET=1: the checks and the table (its times "
                    "are the interpreter's wall time, not a measurement)")
    ap.add_argument("--json", default=None, help="output path (default $OUT/ffn-fast-gemm.json or ./ffn-fast-gemm.json)")
    args = ap.parse_args()

    if args.compile_only:
        return 1 if compile_only(["gelu", "silu"]) else 0

    if args.tiny:
        device, sms = torch.device("cpu"), 2
        shapes = TINY_SHAPES
        args.no_package = True  # the package's TMA configs need the cuda backend
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: use --compile-only or --tiny on a CPU", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        shapes = SHAPES
    if args.shapes:
        shapes = [(int(m), int(k), int(n), a) for m, k, n, a in (s.split(":") for s in args.shapes.split(","))]

    t_start = time.perf_counter()
    info = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
            "interpret": INTERPRET}
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
        info["capability"] = list(torch.cuda.get_device_capability(device))
        info["sms"] = sms
    print(json.dumps(info), flush=True)
    results = []
    for M, K, N, act in shapes:
        print(f"\n== M {M}, K {K}, N {N}, {act} ({time.perf_counter() - t_start:.0f} s)", flush=True)
        try:
            run_shape(M, K, N, act, device, sms, args, t_start, results)
        except Exception as exc:  # noqa: BLE001 - the next shape still runs
            print(f"  shape failed: {_short(exc)}", flush=True)
            results.append({"M": M, "K": K, "N": N, "activation": act, "error": _short(exc)})
    info["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = Path(args.json) if args.json else Path(os.environ.get("OUT") or ".") / "ffn-fast-gemm.json"
    out.write_text(json.dumps({"info": info, "shapes": results}, indent=1, default=str))
    print(f"\nwrote {out} ({info['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
