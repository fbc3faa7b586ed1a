"""Triton kernels of the routed tokens' combine (``experts_routing.py``): a mixture-of-experts
layer's weighted sum of each token's ``top_k`` expert outputs, read in place from the expert-sorted
rows, and its gradients.

Rows are gathered through ``order`` (``ORDERED``; else slot ``i`` is row ``i``): slot ``i = t *
K + k`` is the k-th choice of token t, its row ``order[i]``. Math in fp32; ``ROUND`` rounds each
product (and the sum) to the dtype PyTorch's ``proj * w`` would produce (1: fp16, 2: bf16, 0: fp32,
no rounding), so the result is what ``(proj * w[:, None])[order].view(T, K, H).sum(1)`` computes
(fp32 products, not rounded by hand, may be fused into the sum by the compiler: FMA, at least as
accurate).
Tiles are (``BLOCK_T`` tokens or slots, ``BLOCK_H`` columns), walked persistently where the grid
is capped (``PERSISTENT``); ``INDEX_64`` computes offsets in 64 bits.
"""

import triton
import triton.language as tl


@triton.jit
def _rounded(v, ROUND: tl.constexpr):
    """``v`` (fp32) rounded to the product's dtype and back (``ROUND``: 0 none, 1 fp16, 2 bf16)."""
    if ROUND == 1:
        v = v.to(tl.float16).to(tl.float32)
    elif ROUND == 2:
        v = v.to(tl.bfloat16).to(tl.float32)
    return v


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _rowsum(v):
    """Sum over the columns (``tl.sum`` is a jitted library function the in-process interpreter
    cannot call: ``tl.reduce`` with this module's combine function)."""
    return tl.reduce(v, 1, _add)


@triton.jit
def _slot_rows(order_ptr, slots, mask, ORDERED: tl.constexpr, INDEX_64: tl.constexpr):
    """The rows of ``slots`` (``order[slot]``, or the slot itself)."""
    if ORDERED:
        rows = tl.load(order_ptr + slots, mask=mask, other=0)
    else:
        rows = slots
    if INDEX_64:
        rows = rows.to(tl.int64)
    else:
        rows = rows.to(tl.int32)
    return rows


@triton.jit
def _combine_tile(p_ptr, w_ptr, order_ptr, y_ptr, tile, T, H, spm, sym, K: tl.constexpr, BLOCK_T: tl.constexpr,
                  BLOCK_H: tl.constexpr, WEIGHTED: tl.constexpr, ORDERED: tl.constexpr, ROUND: tl.constexpr,
                  INDEX_64: tl.constexpr):
    tiles_h = (H + BLOCK_H - 1) // BLOCK_H
    rt = (tile // tiles_h) * BLOCK_T + tl.arange(0, BLOCK_T)
    rh = (tile % tiles_h) * BLOCK_H + tl.arange(0, BLOCK_H)
    if INDEX_64:
        rt = rt.to(tl.int64)
        rh = rh.to(tl.int64)
    t_in = rt < T
    mask = t_in[:, None] & (rh < H)[None, :]
    acc = tl.full((BLOCK_T, BLOCK_H), 0.0, tl.float32)
    for k in tl.static_range(K):
        slots = rt * K + k
        rows = _slot_rows(order_ptr, slots, t_in, ORDERED, INDEX_64)
        v = tl.load(p_ptr + rows[:, None] * spm + rh[None, :], mask=mask, other=0.0).to(tl.float32)
        if WEIGHTED:
            w = tl.load(w_ptr + slots, mask=t_in, other=0.0).to(tl.float32)
            v = _rounded(v * w[:, None], ROUND)
        acc += v
    acc = _rounded(acc, ROUND)
    tl.store(y_ptr + rt[:, None] * sym + rh[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def combine_kernel(p_ptr, w_ptr, order_ptr, y_ptr, T, H, n_tiles, nprog, spm, sym, K: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, WEIGHTED: tl.constexpr, ORDERED: tl.constexpr,
                   ROUND: tl.constexpr, PERSISTENT: tl.constexpr, INDEX_64: tl.constexpr):
    """y[t] = sum over k of p[order[t K + k]] * w[t K + k] (w: ``WEIGHTED``), p's rows read once
    each, y written once: the routed tokens' weighted sum, or the token gradient of their gather."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    if PERSISTENT:
        for tile in range(pid, n_tiles, nprog):
            _combine_tile(p_ptr, w_ptr, order_ptr, y_ptr, tile, T, H, spm, sym, K, BLOCK_T, BLOCK_H, WEIGHTED,
                          ORDERED, ROUND, INDEX_64)
    else:
        _combine_tile(p_ptr, w_ptr, order_ptr, y_ptr, pid, T, H, spm, sym, K, BLOCK_T, BLOCK_H, WEIGHTED, ORDERED,
                      ROUND, INDEX_64)


@triton.jit
def _combine_grad_tile(dy_ptr, p_ptr, w_ptr, order_ptr, dp_ptr, dw_ptr, tile, S, H, sdm, spm, sqm,
                       K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, ORDERED: tl.constexpr,
                       ROUND: tl.constexpr, NEED_DW: tl.constexpr, INDEX_64: tl.constexpr):
    slots = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    if INDEX_64:
        slots = slots.to(tl.int64)
    s_in = slots < S
    rows = _slot_rows(order_ptr, slots, s_in, ORDERED, INDEX_64)
    tokens = slots // K
    w = tl.load(w_ptr + slots, mask=s_in, other=0.0).to(tl.float32)
    dot = tl.full((BLOCK_T, BLOCK_H), 0.0, tl.float32)
    for h0 in range(0, H, BLOCK_H):
        rh = h0 + tl.arange(0, BLOCK_H)
        mask = s_in[:, None] & (rh < H)[None, :]
        g = tl.load(dy_ptr + tokens[:, None] * sdm + rh[None, :], mask=mask, other=0.0).to(tl.float32)
        g = _rounded(g, ROUND)  # the gradient as the product's dtype holds it
        tl.store(dp_ptr + rows[:, None] * sqm + rh[None, :], _rounded(g * w[:, None], ROUND).to(
            dp_ptr.dtype.element_ty), mask=mask)
        if NEED_DW:
            p = tl.load(p_ptr + rows[:, None] * spm + rh[None, :], mask=mask, other=0.0).to(tl.float32)
            dot += _rounded(g * p, ROUND)
    if NEED_DW:
        tl.store(dw_ptr + slots, _rounded(_rowsum(dot), ROUND).to(dw_ptr.dtype.element_ty), mask=s_in)


@triton.jit
def combine_grad_kernel(dy_ptr, p_ptr, w_ptr, order_ptr, dp_ptr, dw_ptr, S, H, n_tiles, nprog, sdm, spm, sqm,
                        K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, ORDERED: tl.constexpr,
                        ROUND: tl.constexpr, NEED_DW: tl.constexpr, PERSISTENT: tl.constexpr,
                        INDEX_64: tl.constexpr):
    """The weighted sum's gradients, per slot i = t K + k (``BLOCK_T`` slots a tile, H walked in
    ``BLOCK_H`` columns): dp[order[i]] = dy[t] * w[i] and, with ``NEED_DW``, dw[i] = dy[t] .
    p[order[i]]; dy's rows read K times, p's once, dp written once."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    if PERSISTENT:
        for tile in range(pid, n_tiles, nprog):
            _combine_grad_tile(dy_ptr, p_ptr, w_ptr, order_ptr, dp_ptr, dw_ptr, tile, S, H, sdm, spm, sqm, K,
                               BLOCK_T, BLOCK_H, ORDERED, ROUND, NEED_DW, INDEX_64)
    else:
        _combine_grad_tile(dy_ptr, p_ptr, w_ptr, order_ptr, dp_ptr, dw_ptr, pid, S, H, sdm, spm, sqm, K, BLOCK_T,
                           BLOCK_H, ORDERED, ROUND, NEED_DW, INDEX_64)
