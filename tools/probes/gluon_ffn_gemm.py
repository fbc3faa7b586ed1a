"""Can a warp-specialized Gluon GEMM hide the exact-GELU epilogue of BERT/ViT's FFN up-projection
(x [M, 768] @ W[3072, 768]^T + b, bf16 in/out, fp32 accumulation) on an H100?

Question: our ``tl`` persistent kernel plateaus at ~440 TFLOP/s including the epilogue (88.8 us at
8192 tokens; torch's F.linear + F.gelu 102.6 us, cuBLAS F.linear alone 63.5 us), and
``tl.range(warp_specialize=True)`` hung on the H100 with Triton 3.6. The target is <= 85 us at M 8192
and <= 127 us at M 12608 (ViT 64 x 197), i.e. the bias + erf-GELU epilogue hidden behind another
tile's MMA main loop, as cuBLAS's ping-pong kernels do.
Prediction: explicit Gluon warp specialization (``gl.warp_specialize``) with two consumer warp
groups alternating 128x128 tiles ("ping-pong") and one TMA load warp reaches ~70-80 us at 8192:
while one consumer runs bias + GELU + TMA store, the other keeps the tensor cores busy.

Design (``ffn_gluon_kernel``), persistent (grid = min(#SMs, #tiles), GROUP_M-grouped tile order):
  * load partition, 1 warp, few registers: walks the program's tiles in order and fills a
    ``STAGES``-deep SMEM ring of (A [BM, BK], W [BN, BK]) tiles by TMA, each slot guarded by a
    ``ready`` mbarrier (TMA transaction bytes) and an ``empty`` one (released by the consumer);
  * consumer partitions, 4 warps (one warp group) each, ``pp`` = 2 of them (the default partition
    and one worker), ``solo`` = 1: consumer c takes the program's tiles c, c + 2, ...; its main loop is
    async ``warpgroup_mma`` on the ring (B = the K-major W tile through a permuted SMEM view, one MMA in
    flight, the previous slot released after ``warpgroup_mma_wait(1)``), then the epilogue: + bias,
    GELU (libdevice erf or the Abramowitz & Stegun 7.1.26 erf, |error| <= 1.5e-7), bf16, its own
    SMEM staging buffer, TMA store (M tails clipped by TMA, as are loads: M 12608 = 98.5 x 128).
    The two consumers take turns at the main loop through a pair of ``turn`` mbarriers (CUTLASS's
    ping-pong order barrier): besides keeping the MMAs of one tile back to back, this is needed
    for correctness, since a consumer running more than STAGES ring steps ahead of the landed loads
    would pass a parity wait on a slot of an older round.
  * ``coop``: one consumer of 8 warps (128x256 tile, 64 rows per warp group) plus the load warp; its
    epilogue is not hidden (only the TMA store is asynchronous).
Registers: Triton gives each worker warp group its ``worker_num_regs`` (setmaxnreg) and the default
partition what is left of (warp groups) x (65536 / 32 / warps, padded to whole warp groups), capped at
256: 3 x 168 - 232 - 40 = 232 for pp.

What the 2026-11-27 H100 runs found (M 8192): bias only (act None), ``pp 128x128x64 s4`` runs 64.2 us =
cuBLAS F.linear (63.5 us): the main loop is fine. With the A&S GELU: pp 123.4 us, solo 139.4, coop
105.9; torch F.linear + F.gelu 98.4; target <= 82 us. The GELU on one 4-warp warp group costs ~6.3 us
per 128x128 tile (~90 cycles per element and thread: latency-bound, 1 warp per SM sub-partition), and
in pp it is not hidden behind the other consumer's main loop. (The relu diagnostics of that run failed
their check, err 0.96: the child asked for act "relu" and got the no-activation kernel; fixed.)

``epi`` mode (``ffn_epi_kernel``), the activation in its own, wider partition:
  * MMA consumer (the default partition, 4 warps, setmaxnreg 256): the main loop as above on tiles
    j = 0, 1, ... of the program; after ``warpgroup_mma_wait(0)``: + bias in fp32, bf16 (= F.linear's
    output, which F.gelu reads in torch's unfused pair: the same rounding), wait ``acc_empty[j % NBUF]``,
    store the tile into staging buffer ``j % NBUF`` (NBUF = 2, 32 KB each), ``thread_barrier``, arrive
    ``acc_ready[j % NBUF]``, and on to the next tile's main loop: it never does the GELU math.
  * epilogue partition, ``EPI_WARPS`` (8 or 4) warps, few registers (80 for 8 warps: 32 fp32 values a
    thread per SUB_M = 64-row slice): waits ``acc_ready[j % NBUF]``, per SUB_M-row slice loads the bf16
    tile in a plain blocked layout (8 bf16 = 16 B a thread, 8 threads a 128 B row: one ld.shared.v4 /
    st.shared.v4 each, conflict-free through the 128 B swizzle), GELU in fp32, bf16 back in place;
    ``fence_async_shared``, one TMA store of the tile, ``store_wait(0)``, ``thread_barrier`` (the [128, 128]
    store is two 64-column TMA messages issued by two different warps: each waits for its own), arrive
    ``acc_empty[j % NBUF]``. With act None it only hands on the tile (no SMEM round trip).
  * the load warp, unchanged. Mbarrier parities (all count 1, one elected thread arrives): ring slot s,
    global step g: ``ready`` parity (g // STAGES) & 1, ``empty`` ((g // STAGES) & 1) ^ 1 (a fresh barrier
    passes parity 1); staging buffer b = j % NBUF, use r = j // NBUF: ``acc_ready`` parity r & 1 (the r-th
    fill), ``acc_empty`` (r & 1) ^ 1 (the r-th release; r = 0 passes on the fresh barrier).
  * 4 + 8 + 1 warps are padded to 16 (128 registers each at launch, 4 x 128 = 512 per thread slot):
    256 (MMA, capped) + 2 x 80 + 40 = 456; 4 + 4 + 1 -> 12 warps of 168: 256 + 152 + 40 = 448 <= 504.
    SMEM: 4 x 32 KB ring + 2 x 32 KB staging = 192 KB (+ barriers) of 227 KB.
  * ``epi2``: two ping-pong MMA warp groups (``turn`` barriers as in pp; with NBUF 2 each has its own
    staging buffer) + 8 GELU warps + the load warp = 20 warps of 96 registers at launch (480 per thread
    slot): it fits with 176 (default) + 168 + 2 x 56 + 24 and no spills (ptxas); MMA 152 spills ~1 KB.
  * the point: the GELU runs on 8 warps (2 per SM sub-partition, better latency hiding), concurrently
    with the next tile's MMAs; per tile (~5.5 us of MMA at 64 us / 11.6 tiles per SM) it must take less
    than that, the staging buffer round trip and the TMA store included.
Gluon 3.6 note: a tuple assigned to a name inside a kernel turns its constexprs into int32 tensors, so the
``warp_specialize`` argument tuples of ``ffn_epi_kernel`` are written inline (SUB_M feeds ``static_range``,
ACT a compile-time branch). ``ffn_gluon_kernel`` keeps its named tuples as measured on 11-27 (its ACT, CID
arrive as constants that the backend folds).

Method: every candidate runs in its own subprocess (``--child``) with a timeout, over all shapes, so
that a hung warp-specialized kernel costs one row, not the run (the child also gives up after
``--hang-s`` on its first launch of a shape). Per shape, the child checks the candidate on fresh
random inputs (randn, W / sqrt(K), bias 0.5 randn) against a float64 reference on sampled rows (first
and last 128 rows and 512 random ones) with the output NaN-filled (non-finite anywhere = unwritten
tile), limit 2 x torch's own error + 1e-3, then times the candidate, torch ``F.gelu(F.linear(x, W, b))``
(``F.linear`` for act None) and cuBLAS ``F.linear`` alone with ``triton.testing.do_bench`` (L2 flushed,
median) in ``--rounds`` rounds whose order alternates. Speedups are against the baselines timed in
the same child; the table's baseline rows are the medians over children. Output: a table and
``$OUT/gluon-ffn-gemm.json`` (``--json PATH``; the cwd without ``OUT``).

Gluon has no interpreter (TRITON_INTERPRET does not run it), so there is no CPU ``--tiny`` check:
on a CPU, ``--compile-only`` compiles every candidate for sm90 down to a cubin (ptxas) and reports
warps, shared memory, registers (per partition: setmaxnreg) and spills.

    python tools/probes/gluon_ffn_gemm.py                   # the GPU run (~2-3 min on an H100)
    python tools/probes/gluon_ffn_gemm.py --compile-only    # CPU: compile every candidate for sm90
    python tools/probes/gluon_ffn_gemm.py --shapes 8192:768:3072:gelu --only "epi 128x128x64 s4 w8"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ffn_fast_gemm import _check_rows, _inputs  # noqa: E402 - the same inputs and checked rows as the tl probe

# (M, K, N, activation): BERT-base 16 x 512 tokens, ViT-B/16 64 x 197, 2048 tokens; bias only
SHAPES = [(8192, 768, 3072, "gelu"), (12608, 768, 3072, "gelu"), (2048, 768, 3072, "gelu"),
          (8192, 768, 3072, None)]
ACT_CODE = {None: 0, "erf": 1, "fast": 2, "relu": 3, "lean": 4}  # 1: libdevice erff, 2: Abramowitz & Stegun 7.1.26,
# 3: relu in place of the GELU (a diagnostic: what the epilogue structure costs without its math)

# --------------------------------------------------------------------------------------------
# the kernel
# --------------------------------------------------------------------------------------------


@gluon.constexpr_function
def acc_layout(BLOCK_M, BLOCK_N, num_warps):
    """wgmma accumulator layout: warps stacked along M (16 rows each per instruction), N in one instruction."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                     instr_shape=[16, min(BLOCK_N, 256), 16])


@gluon.jit
def _tile(tile, tiles_m, tiles_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    width = GROUP_M * tiles_n
    first_m = (tile // width) * GROUP_M
    group = gl.minimum(tiles_m - first_m, GROUP_M)
    return (first_m + (tile % width) % group) * BLOCK_M, ((tile % width) // group) * BLOCK_N


@gluon.jit
def _act(x, ACT: gl.constexpr):
    if ACT == 1:  # F.gelu: 0.5 x (1 + erf(x / sqrt 2)), libdevice erff
        x = 0.5 * x * (1.0 + gl.erf(x * 0.7071067811865476))
    elif ACT == 2:  # the same, erf by Abramowitz & Stegun 7.1.26: one exp, one approximate division
        z = gl.abs(x) * 0.7071067811865476
        t = gl.fdiv(gl.full_like(z, 1.0), 1.0 + 0.3275911 * z, ieee_rounding=False)
        p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        q = 0.5 * p * gl.exp(-z * z)  # 0.5 erfc(|x| / sqrt 2): no cancellation for negative x
        x = x * gl.where(x >= 0, 1.0 - q, q)
    elif ACT == 3:
        x = gl.maximum(x, 0.0)
    elif ACT == 4:  # ACT 2 with its constants folded and the flush-to-zero approximate rcp / ex2
        t = gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + 0.2316418882663604 * gl.abs(x)],
                                      dtype=gl.float32, is_pure=True, pack=1)
        p = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
        e = gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * x * -0.7213475204444817],
                                      dtype=gl.float32, is_pure=True, pack=1)
        q = p * e  # 0.5 erfc(|x| / sqrt 2)
        x = x * gl.where(x >= 0, 1.0 - q, q)
    return x


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, GROUP_M: gl.constexpr):
    """1 warp: the program's tiles in order, K steps into the ring (global step g -> slot g % STAGES)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    tiles_m = gl.cdiv(a_desc.shape[0], BLOCK_M)
    tiles_n = gl.cdiv(b_desc.shape[0], BLOCK_N)
    k_tiles = gl.cdiv(a_desc.shape[1], BLOCK_K)
    g = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        off_m, off_n = _tile(tile, tiles_m, tiles_n, BLOCK_M, BLOCK_N, GROUP_M)
        for ki in range(k_tiles):
            s = g % STAGES
            # round r of a slot waits for the r-th release; a fresh barrier passes parity 1
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, ki * BLOCK_K], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [off_n, ki * BLOCK_K], bar, b_bufs.index(s))
            g += 1


@gluon.jit
def _tile_mma(a_bufs, b_bufs, ready, empty, turn, acc, g, k_tiles, t, CID: gl.constexpr, CONSUMERS: gl.constexpr):
    """One tile's main loop from global ring step ``g`` (the consumer's ``t``-th tile): async wgmma,
    one MMA in flight, each slot released once the MMA after it is issued; with two consumers, in
    turns (a consumer waits for the other's previous main loop, consumer 0 starts, and passes the
    turn once its MMAs are issued). Returns the accumulator after all MMAs finished, and the step
    after the tile's last (whose slot it has released)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    if CONSUMERS == 2:
        mbarrier.wait(turn.index(CID), (t & 1) ^ (1 - CID))
    for ki in range(k_tiles):
        s = g % STAGES
        mbarrier.wait(ready.index(s), (g // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, use_acc=ki > 0, is_async=True)
        acc = warpgroup_mma_wait(1, deps=(acc, ))
        # the MMA of step g - 1 has finished reading its slot
        mbarrier.arrive(empty.index((g + STAGES - 1) % STAGES), pred=ki > 0)
        g += 1
    if CONSUMERS == 2:  # all of this tile's MMAs are issued: the other consumer's turn
        mbarrier.arrive(turn.index(1 - CID))
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(empty.index((g + STAGES - 1) % STAGES))
    return acc, g


@gluon.jit
def _consumer(a_desc, b_desc, c_desc, bias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, turn,
              GROUP_M: gl.constexpr, ACT: gl.constexpr, CID: gl.constexpr, CONSUMERS: gl.constexpr):
    """One warp group (or two for coop): main loop on tiles CID, CID + CONSUMERS, ..., then the epilogue."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    layout: gl.constexpr = acc_layout(BLOCK_M, BLOCK_N, gl.num_warps())
    N = b_desc.shape[0]
    tiles_m = gl.cdiv(a_desc.shape[0], BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(a_desc.shape[1], BLOCK_K)
    c_smem = c_bufs.index(CID)
    nprog = gl.num_programs(0)
    j = CID  # the tile's index in the program's sequence (the loader's order)
    t = 0  # this consumer's own tile count
    for tile in range(gl.program_id(0) + CID * nprog, tiles_m * tiles_n, CONSUMERS * nprog):
        off_m, off_n = _tile(tile, tiles_m, tiles_n, BLOCK_M, BLOCK_N, GROUP_M)
        rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        bias = gl.load(bias_ptr + rn, mask=rn < N, other=0.0)
        acc = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, layout)
        acc, g = _tile_mma(a_bufs, b_bufs, ready, empty, turn, acc, j * k_tiles, k_tiles, t, CID, CONSUMERS)
        acc = _act(acc + gl.expand_dims(bias.to(gl.float32), 0), ACT)
        tma.store_wait(0)  # this consumer's previous store has left c_smem
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
        j += CONSUMERS
        t += 1
    tma.store_wait(0)


@gluon.jit
def ffn_gluon_kernel(a_desc, b_desc, c_desc, bias_ptr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                     CONSUMERS: gl.constexpr, ACT: gl.constexpr, LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr):
    """C = act(A @ W^T + bias): A (M, K), W (N, K), C (M, N) through Gluon TMA descriptors (C's block
    = the tile). num_warps = warps per consumer (4 for pp, 8 for coop)."""
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [CONSUMERS] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    first: gl.constexpr = 0
    second: gl.constexpr = 1
    load = (a_desc, b_desc, a_bufs, b_bufs, ready, empty, GROUP_M)
    c0 = (a_desc, b_desc, c_desc, bias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, turn, GROUP_M, ACT, first, CONSUMERS)
    if CONSUMERS == 2:
        c1 = (a_desc, b_desc, c_desc, bias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, turn, GROUP_M, ACT, second,
              CONSUMERS)
        gl.warp_specialize([(_consumer, c0), (_consumer, c1), (_loader, load)], [gl.num_warps(), 1],
                           [MMA_REGS, LOAD_REGS])
    else:
        gl.warp_specialize([(_consumer, c0), (_loader, load)], [1], [LOAD_REGS])


@gluon.jit
def _epi_mma(a_desc, b_desc, bias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, turn, acc_ready, acc_empty,
             GROUP_M: gl.constexpr, CID: gl.constexpr, CONSUMERS: gl.constexpr):
    """epi mode, an MMA warp group: the main loop of the program's tiles j = CID, CID + CONSUMERS, ..., then
    + bias (fp32), bf16 into staging buffer j % NBUF, hand-off to the epilogue partition. No activation here."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    NBUF: gl.constexpr = c_bufs.type.shape[0]
    layout: gl.constexpr = acc_layout(BLOCK_M, BLOCK_N, gl.num_warps())
    N = b_desc.shape[0]
    tiles_m = gl.cdiv(a_desc.shape[0], BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(a_desc.shape[1], BLOCK_K)
    nprog = gl.num_programs(0)
    j = CID  # the tile's index in the program's sequence (the loader's and the epilogue's order)
    t = 0  # this consumer's own tile count
    for tile in range(gl.program_id(0) + CID * nprog, tiles_m * tiles_n, CONSUMERS * nprog):
        off_m, off_n = _tile(tile, tiles_m, tiles_n, BLOCK_M, BLOCK_N, GROUP_M)
        rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        bias = gl.load(bias_ptr + rn, mask=rn < N, other=0.0)
        acc = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, layout)
        acc, g = _tile_mma(a_bufs, b_bufs, ready, empty, turn, acc, j * k_tiles, k_tiles, t, CID, CONSUMERS)
        # bf16(acc + bias) = F.linear's output, which F.gelu reads in torch's unfused pair
        y = (acc + gl.expand_dims(bias.to(gl.float32), 0)).to(c_bufs.dtype)
        buf = j % NBUF
        # use r = j // NBUF of buffer buf waits for the epilogue's r-th release (a fresh barrier passes parity 1)
        mbarrier.wait(acc_empty.index(buf), ((j // NBUF) & 1) ^ 1)
        c_bufs.index(buf).store(y)
        gl.thread_barrier()  # all 4 warps' stores are in SMEM before the (single-thread) arrive
        mbarrier.arrive(acc_ready.index(buf))
        j += CONSUMERS
        t += 1


@gluon.jit
def _epi_act(a_desc, b_desc, c_desc, c_bufs, acc_ready, acc_empty, GROUP_M: gl.constexpr, ACT: gl.constexpr,
             SUB_M: gl.constexpr):
    """epi mode, the epilogue partition (EPI_WARPS warps): every tile j of the program in order, from staging
    buffer j % NBUF: SUB_M-row slices loaded (blocked layout, 16 B per thread and row), act in fp32, bf16 back in
    place; then one TMA store of the tile, waited for before the buffer goes back to the MMA warp group."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    NBUF: gl.constexpr = c_bufs.type.shape[0]
    VEC: gl.constexpr = 8  # 8 bf16 = 16 B: one 128 B swizzle row per 8 threads, 4 rows per warp instruction
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [4, 8], [gl.num_warps(), 1], [1, 0])  # BLOCK_N >= 64
    tiles_m = gl.cdiv(a_desc.shape[0], BLOCK_M)
    tiles_n = gl.cdiv(b_desc.shape[0], BLOCK_N)
    j = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        off_m, off_n = _tile(tile, tiles_m, tiles_n, BLOCK_M, BLOCK_N, GROUP_M)
        buf = j % NBUF
        mbarrier.wait(acc_ready.index(buf), (j // NBUF) & 1)  # the r-th fill of buf: parity r & 1
        c_smem = c_bufs.index(buf)
        if ACT != 0:  # act None: the hand-off and the store alone
            for r in gl.static_range(BLOCK_M // SUB_M):
                part = c_smem.slice(r * SUB_M, SUB_M)
                part.store(_act(part.load(layout).to(gl.float32), ACT).to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
        tma.store_wait(0)  # the store has read buf (issuing thread) ...
        gl.thread_barrier()  # ... and every thread knows it before the (single-thread) release
        mbarrier.arrive(acc_empty.index(buf))
        j += 1


@gluon.jit
def ffn_epi_kernel(a_desc, b_desc, c_desc, bias_ptr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                   CONSUMERS: gl.constexpr, ACT: gl.constexpr, LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr,
                   NBUF: gl.constexpr, EPI_WARPS: gl.constexpr, EPI_REGS: gl.constexpr, SUB_M: gl.constexpr):
    """epi mode: C = act(A @ W^T + bias) with the activation in its own EPI_WARPS-warp partition.
    num_warps = 4 (the default partition = MMA consumer 0)."""
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [NBUF] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    acc_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    acc_empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(NBUF):
        mbarrier.init(acc_ready.index(i), count=1)
        mbarrier.init(acc_empty.index(i), count=1)
    # the argument tuples are written inline: a tuple assigned to a name turns its constexprs into int32
    # tensors (SUB_M must stay a constexpr for static_range; ACT and CID stay compile-time branches)
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_epi_mma, (a_desc, b_desc, bias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, turn, acc_ready, acc_empty,
                        GROUP_M, 0, CONSUMERS)),
            (_epi_mma, (a_desc, b_desc, bias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, turn, acc_ready, acc_empty,
                        GROUP_M, 1, CONSUMERS)),
            (_epi_act, (a_desc, b_desc, c_desc, c_bufs, acc_ready, acc_empty, GROUP_M, ACT, SUB_M)),
            (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, GROUP_M)),
        ], [gl.num_warps(), EPI_WARPS, 1], [MMA_REGS, EPI_REGS, LOAD_REGS])
    else:
        gl.warp_specialize([
            (_epi_mma, (a_desc, b_desc, bias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, turn, acc_ready, acc_empty,
                        GROUP_M, 0, CONSUMERS)),
            (_epi_act, (a_desc, b_desc, c_desc, c_bufs, acc_ready, acc_empty, GROUP_M, ACT, SUB_M)),
            (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, GROUP_M)),
        ], [EPI_WARPS, 1], [EPI_REGS, LOAD_REGS])


# --------------------------------------------------------------------------------------------
# candidates
# --------------------------------------------------------------------------------------------

def _cand(mode, bm, bn, stages, erf="fast", bk=64, group=8, load_regs=40, mma_regs=232, consumers=None,
          epi_warps=8, epi_regs=None, sub_m=None, nbuf=2):
    """mode: pp (2 ping-pong 4-warp consumers), solo (1 of them), coop (1 of 8 warps), epi (4-warp MMA
    consumer(s) + an epi_warps-warp activation partition); erf: fast (A&S), erf (libdevice) or relu (diagnostic)."""
    if consumers is None:
        consumers = 2 if mode == "pp" else 1
    c = {"mode": mode, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": stages, "GROUP_M": group,
         "erf": erf, "LOAD_REGS": load_regs, "MMA_REGS": mma_regs, "CONSUMERS": consumers,
         "num_warps": 8 if mode == "coop" else 4}
    g = f" g{group}" if group != 8 else ""
    r = f" r{mma_regs}/{load_regs}" if (load_regs, mma_regs) != (40, 232) else ""
    if mode == "epi":
        # 4 + epi_warps + 1 warps, padded to whole warp groups: the launch gives each 65536 / (32 x warps)
        # registers (a multiple of 8); the default partition gets the rest of (warp groups) x that
        epi_regs = epi_regs or (80 if epi_warps == 8 else 152)
        sub_m = sub_m or (64 if epi_warps == 8 else 32)
        c.update(EPI_WARPS=epi_warps, EPI_REGS=epi_regs, SUB_M=sub_m, NBUF=nbuf)
        m = "epi2" if consumers == 2 else "epi"
        r = f" r{mma_regs}/{epi_regs}/{load_regs}" if consumers == 2 else f" r{epi_regs}/{load_regs}"
        c["name"] = f"{m} {bm}x{bn}x{bk} s{stages}{g} w{epi_warps} sub{sub_m} b{nbuf}{r} {erf}"
    else:
        c["name"] = f"{mode} {bm}x{bn}x{bk} s{stages}{g}{r} {erf}"
    return c


#: in the order they run (the most likely winner first: the budget may cut the tail)
CANDIDATES = [
    # lean: the A&S GELU with its constants folded and flush-to-zero approximate rcp / ex2 (inline PTX)
    # epi2: 2 ping-pong MMA warp groups (one staging buffer each) + 8 GELU warps + load warp = 20 warps, 96
    # registers each at launch (5 x 96 = 480 per thread slot): 176 default + 168 + 2 x 56 + 24 (152 spills)
    _cand("epi", 128, 128, 4, consumers=2, mma_regs=168, epi_regs=56, load_regs=24, erf="lean"),
    _cand("pp", 128, 128, 4, erf="lean"),       # ping-pong, 2 x 32 KB C staging + 4 x 32 KB ring = 192 KB
    # epi: 4-warp MMA consumer + 8-warp GELU partition + load warp; 4 x 32 KB ring + 2 x 32 KB staging
    _cand("epi", 128, 128, 4, erf="lean"),
    _cand("coop", 128, 256, 3, erf="lean"),     # one 8-warp consumer, epilogue not hidden
    # the 2026-11-27 runs' best, as controls, and the epi2 hand-off without the math
    _cand("epi", 128, 128, 4, consumers=2, mma_regs=168, epi_regs=56, load_regs=24),
    _cand("epi", 128, 128, 4, consumers=2, mma_regs=168, epi_regs=56, load_regs=24, erf="relu"),
    _cand("pp", 128, 128, 4),
    _cand("epi", 128, 128, 4),
    _cand("pp", 128, 128, 4, erf="relu"),
]


def _act_code(cfg, act):
    """The kernel's ACT for a shape's activation: gelu -> the candidate's erf (or relu for a relu diagnostic);
    the child passes act "relu" itself for the relu diagnostics (its reference is relu)."""
    if act == "relu":
        return ACT_CODE["relu"]
    return ACT_CODE[cfg["erf"]] if act == "gelu" else ACT_CODE[None]


def _kernel(cfg):
    return ffn_epi_kernel if cfg["mode"] == "epi" else ffn_gluon_kernel


def _constexprs(cfg, act):
    c = dict(GROUP_M=cfg["GROUP_M"], STAGES=cfg["STAGES"], CONSUMERS=cfg["CONSUMERS"], ACT=_act_code(cfg, act),
             LOAD_REGS=cfg["LOAD_REGS"], MMA_REGS=cfg["MMA_REGS"])
    if cfg["mode"] == "epi":
        c.update(NBUF=cfg["NBUF"], EPI_WARPS=cfg["EPI_WARPS"], EPI_REGS=cfg["EPI_REGS"], SUB_M=cfg["SUB_M"])
    return c


def _layout(block):
    return gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)


def _blocks(cfg):
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    return [bm, bk], [bn, bk], [bm, bn]


def make_runner(cfg, act, x, w, b, out, sms):
    """A closure launching the kernel on fixed operands (descriptors built once)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    M, N = out.shape
    ab, bb, cb = _blocks(cfg)
    a_d = TensorDescriptor.from_tensor(x, ab, _layout(ab))
    b_d = TensorDescriptor.from_tensor(w, bb, _layout(bb))
    c_d = TensorDescriptor.from_tensor(out, cb, _layout(cb))
    tiles = triton.cdiv(M, cb[0]) * triton.cdiv(N, cb[1])
    grid = (min(tiles, sms),)
    consts = _constexprs(cfg, act)
    kernel = _kernel(cfg)

    def run():
        return kernel[grid](a_d, b_d, c_d, b, **consts, num_warps=cfg["num_warps"])

    return run


# --------------------------------------------------------------------------------------------
# compile for a fake sm90 on the CPU
# --------------------------------------------------------------------------------------------

def _tool(name):
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def _resources(kernel) -> str:
    """cuobjdump's kernel-entry registers, setmaxnreg per partition (PTX), ptxas's spill line."""
    ptx = kernel.asm["ptx"]
    parts = []
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        r = subprocess.run([str(_tool("cuobjdump")), "--dump-resource-usage", str(cubin)], capture_output=True,
                           text=True)
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", r.stdout)
        if m:
            parts.append(f"entry regs {m.group(1)}, stack {m.group(2)}, local {m.group(4)}")
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        r = subprocess.run([str(_tool("ptxas")), "-v", "--gpu-name=sm_90a", str(src), "-o", str(Path(d) / "x.cubin")],
                           capture_output=True, text=True)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
        if m:
            parts.append(f"spills {m.group(1)}/{m.group(2)} B st/ld")
    regs = sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}, reverse=True)
    parts.append(f"setmaxnreg {regs}")
    return ", ".join(parts)


def _describe(kernel) -> str:
    ptx = kernel.asm["ptx"]
    return (f"warps {kernel.metadata.num_warps}, smem {kernel.metadata.shared} B, "
            f"wgmma {len(re.findall(r'wgmma.mma_async', ptx))}, "
            f"tma-stores {len(re.findall(r'cp.async.bulk.tensor.[0-9]d.global.shared', ptx))}, {_resources(kernel)}")


def _sm90_compile(cfg, act):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {n: f"tensordesc<bf16[{b[0]}, {b[1]}],{_layout(b)!r}>" for n, b in zip(("a_desc", "b_desc", "c_desc"),
                                                                                 _blocks(cfg))}
    sig["bias_ptr"] = "*bf16"
    consts = _constexprs(cfg, act)
    sig.update({k: "constexpr" for k in consts})
    attrs = {(3,): [["tt.divisibility", 16]]}
    return triton.compile(GluonASTSource(_kernel(cfg), sig, consts, attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg["num_warps"]})


def compile_only(cands) -> int:
    failures = 0
    for cfg in cands:
        for act in ("gelu", None):
            t0 = time.perf_counter()
            label = f"{str(act):5} {cfg['name']:36}"
            try:
                k = _sm90_compile(cfg, act)
                if not k.asm.get("cubin"):
                    raise RuntimeError("no cubin")
                print(f"{label} ok {time.perf_counter() - t0:5.1f}s  {_describe(k)}", flush=True)
            except Exception as exc:  # noqa: BLE001 - report and go on
                failures += 1
                print(f"{label} FAILED {_short(exc)}", flush=True)
    return failures


# --------------------------------------------------------------------------------------------
# the child: one candidate, every shape (checks and timing)
# --------------------------------------------------------------------------------------------

def _apply(y, act):
    return F.gelu(y) if act == "gelu" else F.relu(y) if act == "relu" else y


def torch_ref(x, w, b, act):
    return _apply(F.linear(x, w, b), act)


def _rel_err(got, x, w, b, act, rows):
    ref = _apply(x[rows].double() @ w.double().T + b.double(), act)
    return (got[rows].double() - ref).abs().max().item() / ref.abs().max().item()


def _wait(hang_s):
    """Synchronize, giving up (the process exits: a hung kernel cannot be stopped) after hang_s."""
    ev = torch.cuda.Event()
    ev.record()
    deadline = time.perf_counter() + hang_s
    while not ev.query():
        if time.perf_counter() > deadline:
            return False
        time.sleep(0.002)
    return True


def _short(exc) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {(lines[-1] if lines else '')[:240]}"


def child(cfg, shapes, rounds, hang_s) -> int:
    from triton.testing import do_bench

    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for M, K, N, act in shapes:
        res = {"M": M, "K": K, "N": N, "activation": act}
        act = "relu" if act == "gelu" and cfg["erf"] == "relu" else act  # the diagnostic's own reference
        x, w, b = _inputs(M, K, N, device, seed=1000 + M)
        fns = {"torch": lambda x=x, w=w, b=b, act=act: torch_ref(x, w, b, act),
               "cublas": lambda x=x, w=w, b=b: F.linear(x, w, b)}
        xc, wc, bc = _inputs(M, K, N, device, seed=7 * M + 1)
        rows = _check_rows(M, device, seed=M)
        res["torch_err"] = torch_err = _rel_err(torch_ref(xc, wc, bc, act), xc, wc, bc, act, rows)
        try:
            t0 = time.perf_counter()
            out = torch.full((M, N), float("nan"), device=device, dtype=torch.bfloat16)
            handle = make_runner(cfg, act, xc, wc, bc, out, sms)()  # compiles, then launches
            res["compile_s"] = round(time.perf_counter() - t0, 2)
            res["n_regs"], res["n_spills"] = handle.n_regs, handle.n_spills
            res["shared"], res["num_warps"] = handle.metadata.shared, handle.metadata.num_warps
            if not _wait(hang_s):
                res["error"] = f"hang: first launch not done after {hang_s} s"
                print("@@" + json.dumps(res), flush=True)
                os._exit(3)
            res["err"], res["finite"] = _rel_err(out, xc, wc, bc, act, rows), bool(torch.isfinite(out).all().item())
            limit = 2 * torch_err + 1e-3
            if not res["finite"] or not res["err"] <= limit:
                res["error"] = (f"check failed: max|err|/max|ref| {res['err']:.2e} (limit {limit:.2e}), "
                                f"finite {res['finite']}")
            else:
                out = torch.empty((M, N), device=device, dtype=torch.bfloat16)
                fns["cand"] = make_runner(cfg, act, x, w, b, out, sms)
        except Exception as exc:  # noqa: BLE001 - a candidate that fails is a row, not the end
            res["error"] = _short(exc)
        del xc, wc, bc
        names = list(fns)
        ms = {n: [] for n in names}
        for rnd in range(rounds):
            for n in (names if rnd % 2 == 0 else names[::-1]):
                ms[n].append(do_bench(fns[n], warmup=25, rep=100, return_mode="median"))
        res["us_rounds"] = {n: [round(v * 1e3, 2) for v in ms[n]] for n in names}
        print("@@" + json.dumps(res), flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# the parent: one child per candidate, a table, JSON
# --------------------------------------------------------------------------------------------

def _run_child(cfg, args, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", cfg["name"], "--rounds", str(args.rounds),
           "--hang-s", str(args.hang_s), "--shapes", ",".join(f"{m}:{k}:{n}:{a}" for m, k, n, a in args.shape_list)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)  # the child's own session: it and its compiler subprocesses
            p.wait()
            rc = None
        out.seek(0)
        err.seek(0)
        results = [json.loads(ln[2:]) for ln in out.read().splitlines() if ln.startswith("@@")]
        tail = [ln for ln in err.read().splitlines() if ln.strip()][-3:]
    if rc is None:
        note = f"timeout after {timeout:.1f} s"
    elif rc == 3 and results and "hang" in results[-1].get("error", ""):
        note = f"not run: the child stopped at a hang at M {results[-1]['M']}"
    elif rc != 0:
        note = f"child exit {rc}: {' | '.join(tail)[-300:]}"
    else:
        note = None
    return results, note


def _shape_key(r):
    return (r["M"], r["K"], r["N"], r["activation"])


def parent(args) -> int:
    t_start = time.perf_counter()
    info = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
            "device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
            "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    print(json.dumps(info), flush=True)
    by_shape = {s: [] for s in args.shape_list}  # per shape: (candidate, child result or error)
    for cfg in args.cands:
        left = args.budget_s - (time.perf_counter() - t_start)
        if left < 20:
            for s in args.shape_list:
                by_shape[s].append((cfg, {"error": f"skipped: past the --budget-s {args.budget_s} s"}))
            print(f"{cfg['name']:36} skipped (budget)", flush=True)
            continue
        t0 = time.perf_counter()
        results, note = _run_child(cfg, args, min(args.candidate_timeout, left))
        got = {_shape_key(r): r for r in results}
        for s in args.shape_list:
            by_shape[s].append((cfg, got.get(s) or {"error": note or "no result"}))
        errs = "; ".join(f"{r['M']}: {r['error']}" for r in results if "error" in r)
        print(f"{cfg['name']:36} {time.perf_counter() - t0:5.1f}s  {len(results)} shapes"
              f"{'  ' + note if note else ''}{'  ' + errs if errs else ''}", flush=True)

    entries = []
    for (M, K, N, act), rows in by_shape.items():
        flops = 2.0 * M * N * K
        base = {"torch": [], "cublas": []}
        for _, r in rows:
            for n in base:
                if n in r.get("us_rounds", {}):
                    base[n].append(statistics.median(r["us_rounds"][n]))
        base = {n: statistics.median(v) for n, v in base.items() if v}
        label = f"{M}x{K}->{N} {act}"
        print(f"\n  {label:24} {'candidate':36} {'us median [min-max]':>24} {'TFLOP/s':>8} {'vs torch':>8} "
              f"{'vs cuBLAS':>9}  check")
        tname = f"torch F.linear{' + F.gelu' if act == 'gelu' else ''}"
        for n, name in (("torch", tname), ("cublas", "torch F.linear (cuBLAS alone)")):
            if n in base:
                print(f"  {label:24} {name:36} {base[n]:24.1f} {flops / base[n] / 1e6:8.1f}")
        out_rows = []
        for cfg, r in rows:
            row = {"name": cfg["name"], "config": {k: v for k, v in cfg.items() if k != "name"}, **r}
            cand = r.get("us_rounds", {}).get("cand")
            if cand:
                med = statistics.median(cand)
                row.update(us_median=med, us_min=min(cand), us_max=max(cand), tflops=flops / med / 1e6)
                own = {n: statistics.median(v) for n, v in r["us_rounds"].items()}
                row["vs_torch"] = own["torch"] / med if "torch" in own else None
                row["vs_cublas"] = own["cublas"] / med if "cublas" in own else None
                span = f"{med:.1f} [{min(cand):.1f}-{max(cand):.1f}]"
                vt = f"{row['vs_torch']:.3f}" if row["vs_torch"] else "-"
                vc = f"{row['vs_cublas']:.3f}" if row["vs_cublas"] else "-"
                print(f"  {label:24} {cfg['name']:36} {span:>24} {row['tflops']:8.1f} {vt:>8} {vc:>9}  "
                      f"err {r['err']:.1e}, regs {r.get('n_regs')}, spills {r.get('n_spills')}")
            else:
                print(f"  {label:24} {cfg['name']:36} {r.get('error', 'not timed')}")
            out_rows.append(row)
        entries.append({"M": M, "K": K, "N": N, "activation": act, "baselines_us": base, "rows": out_rows})
    info["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = Path(args.json) if args.json else Path(os.environ.get("OUT") or ".") / "gluon-ffn-gemm.json"
    out.write_text(json.dumps({"info": info, "shapes": entries}, indent=1, default=str))
    print(f"\nwrote {out} ({info['wall_s']} s)")
    return 0


def _parse_shapes(text):
    shapes = []
    for s in text.split(","):
        m, k, n, a = s.split(":")
        shapes.append((int(m), int(k), int(n), None if a.lower() in ("none", "") else a))
    return shapes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=None, help="M:K:N:act,... with act gelu or None (default: 8192/12608/2048 "
                    "x 768 -> 3072 gelu, 8192 x 768 -> 3072 None)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (order alternates)")
    ap.add_argument("--only", default=None, help="comma-separated substrings: run only candidates whose name "
                    "contains one")
    ap.add_argument("--budget-s", type=float, default=150.0, help="start no candidate after this many seconds")
    ap.add_argument("--candidate-timeout", type=float, default=60.0,
                    help="seconds for one candidate's subprocess (all shapes: start-up, compiles, checks, timing)")
    ap.add_argument("--hang-s", type=float, default=10.0, help="a first launch not done after this is a hang")
    ap.add_argument("--compile-only", action="store_true",
                    help="(CPU) compile every candidate for sm90 and report warps, shared memory, registers, "
                    "spills; no device needed")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="output path (default $OUT/gluon-ffn-gemm.json or "
                    "./gluon-ffn-gemm.json)")
    args = ap.parse_args()
    args.shape_list = _parse_shapes(args.shapes) if args.shapes else SHAPES
    args.cands = [c for c in CANDIDATES if not args.only or any(s in c["name"] for s in args.only.split(","))]

    if args.compile_only:
        return 1 if compile_only(args.cands) else 0
    if args.child:
        cfg = next(c for c in CANDIDATES if c["name"] == args.child)
        return child(cfg, args.shape_list, args.rounds, args.hang_s)
    if not torch.cuda.is_available():
        print("no CUDA device: use --compile-only on a CPU", file=sys.stderr)
        return 2
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
