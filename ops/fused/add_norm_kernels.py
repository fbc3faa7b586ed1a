"""Triton source of ``add_layer_norm`` / ``add_rms_norm``: the residual add and the norm after it.

One program normalizes a tile of ``BLOCK_M`` rows of length ``N`` (the last dim). Per row:

    s = round_to_s_dtype(x + residual)        # what torch's ``x + residual`` gives, fp32 inside
    LayerNorm: y = (s - mean(s)) * rsqrt(var(s) + eps) * w + b
    RMSNorm:   y = s * rsqrt(mean(s^2) + eps) * (offset + w)

Statistics are accumulated in fp32 whatever the dtype; ``y`` is rounded once, at the store. ``s``
is rounded to its dtype before the statistics, so ``y`` is exactly what ``norm(x + residual)``
is in torch, where the sum is a tensor of that dtype.

* ``ONE_CHUNK``: ``N <= BLOCK_N``: the whole row tile stays in registers / the unified buffer;
  the mean is taken first, then the variance of ``s - mean`` (two-pass in registers, no
  cancellation). Memory traffic: x, residual read once; s, y written once.
* otherwise the row is walked in chunks of ``BLOCK_N`` twice: pass 1 reads x and residual, stores
  s and merges each chunk's (mean, M2) into the running ones (Chan et al.'s pairwise update, as
  stable as two passes); pass 2 recomputes s from x and residual (it never reads back its own
  stores, whose visibility within a program no backend promises) and writes y.
* ``PERSISTENT``: fewer programs than row tiles (Ascend: one per vector core); program ``pid``
  takes tiles ``pid, pid + nprog, ...``.
* ``INDEX_64``: row offsets can pass 2**31 - 1.

Operands: x, residual, s, y have a row stride each and unit column stride (the host copies other
layouts); a residual broadcast along the rows has row stride 0. ``mean``/``rstd`` (fp32, one per
row) are written only when ``STORE_STATS`` (autograd keeps them for the backward).

``add_norm_bwd_kernel`` (below) is the backward: per row tile d(s) = rstd * (g - mean(g) -
xhat * mean(g * xhat)) + ds from s (or x + residual recomputed), dy, ds, w and the saved
statistics, written once as d(x) / d(residual); d(w)/d(b) partial sums per program, which
``part_sum_kernel`` sums over the programs and writes in the parameters' dtypes (host side and
traffic: ``add_norm_bwd.py``).

``add_norm_dropout_kernel`` / ``add_norm_dropout_bwd_kernel`` are the same two with
``norm(dropout(x, p) + residual)``: each element of x kept with probability ``1 - p`` by a
Philox-4x32-10 draw under an int64 seed read from memory (:func:`_keep`: one draw, Triton's
``tl.rand4x`` bit for bit, serves four neighbouring columns), scaled by ``1 / (1 - p)`` and
rounded to x's dtype as torch's dropout rounds it; the mask is never stored: the backward draws
it again and writes d(x) through it, d(residual) apart. The compiled training form launches them
(``add_norm_compiled.py``).

Rules for kernels here (they also run under the in-process interpreter): call only helpers of
this module and ``tl`` builtins, take the program count as an argument, no ``tl.cdiv``.
"""

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _rowsum(v):
    """Sum over the columns (``tl.sum`` spelled as ``tl.reduce`` with this module's combine
    function: ``tl.sum`` is a jitted library function the in-process interpreter cannot call)."""
    return tl.reduce(v, 1, _add)


@triton.jit
def _round_to(s, S_TY: tl.constexpr):
    """``s`` rounded to ``S_TY`` (to nearest, ties to even), back in fp32. bfloat16 is rounded by
    hand first, so that the cast is exact whatever rounding mode a backend's fp32 -> bf16 cast
    has (Triton's interpreter truncates): s is then bit-identical to torch's ``x + residual``."""
    if S_TY == tl.bfloat16:
        bits = s.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        s = tl.where(s == s, bits.to(tl.float32, bitcast=True), s)  # NaN stays NaN
    return s.to(S_TY).to(tl.float32)


@triton.jit
def _uniform4(k0, k1, ctr, INDEX_64: tl.constexpr):
    """Four uniform floats in [0, 1) per counter in ``ctr``: the four words of Philox-4x32-10 at
    counter ``(ctr, 0, 0, 0)`` (``(lo, hi, 0, 0)`` for 64-bit counters) under the key ``(k0, k1)``,
    each converted to a float: Triton's ``tl.rand4x`` bit for bit (written here with ``tl``
    builtins: the in-process interpreter runs only this module's helpers)."""
    if INDEX_64:
        c0 = (ctr & 0xFFFFFFFF).to(tl.uint32)
        c1 = (ctr >> 32).to(tl.uint32)
    else:
        c0 = ctr.to(tl.uint32, bitcast=True)
        c1 = c0 * 0
    c2 = c0 * 0
    c3 = c0 * 0
    for _ in tl.static_range(10):
        a0 = c0
        a2 = c2
        c0 = tl.umulhi(0xCD9E8D57, a2) ^ c1 ^ k0
        c2 = tl.umulhi(0xD2511F53, a0) ^ c3 ^ k1
        c1 = a2 * 0xCD9E8D57  # uint32: wraps (no tl.mul(sanitize_overflow=...) in every Triton)
        c3 = a0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return _to_uniform(c0), _to_uniform(c1), _to_uniform(c2), _to_uniform(c3)


@triton.jit
def _to_uniform(c):
    v = c.to(tl.int32, bitcast=True)
    v = tl.where(v < 0, -v - 1, v)
    return v * 4.6566127342e-10


@triton.jit
def _keep(k0, k1, p, qoff, cols, INDEX_64: tl.constexpr):
    """A dropout's keep mask on one tile of rows x ``cols`` (a chunk of ``BLOCK_N`` columns):
    each element kept with probability ``1 - p``, as torch's dropout keeps. Column ``col`` of a
    row takes word ``col % 4`` of the Philox draw at counter ``qoff[row] + col // 4`` (``qoff``:
    the row's first counter plus the chunk's first column / 4), so one draw serves four
    elements, as torch's own dropout kernel uses all four words."""
    QN: tl.constexpr = cols.shape[0] // 4
    u0, u1, u2, u3 = _uniform4(k0, k1, qoff[:, None] + tl.arange(0, QN)[None, :], INDEX_64)
    u = tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), (qoff.shape[0], cols.shape[0]))
    return u >= p


@triton.jit
def _seed_keys(seed_ptr):
    """The Philox key of a dropout call: the two 32-bit halves of the int64 at ``seed_ptr``."""
    seed = tl.load(seed_ptr)
    return (seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def _load_sum(x_ptr, r_ptr, xoff, roff, cols, mask, qoff, k0, k1, p, HAS_RES: tl.constexpr, S_TY: tl.constexpr,
              DROPOUT: tl.constexpr, INDEX_64: tl.constexpr):
    """s = x + residual on one tile, rounded to s's dtype, returned in fp32 (0 where masked).
    ``DROPOUT``: x is dropped first, as torch's ``dropout(x, p)`` computes it (kept elements
    times ``1 / (1 - p)`` rounded to x's dtype, the others 0; the mask :func:`_keep`'s)."""
    s = tl.load(x_ptr + xoff[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if DROPOUT:
        kept = _round_to(s * (1.0 / (1.0 - p)), x_ptr.dtype.element_ty)
        s = tl.where(_keep(k0, k1, p, qoff, cols, INDEX_64), kept, 0.0)
    if HAS_RES:
        r = tl.load(r_ptr + roff[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        s = _round_to(s + r, S_TY)
    return s


@triton.jit
def _scale_shift(yhat, w_ptr, b_ptr, cols, cmask, offset,
                 RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        if RMS:
            w = w + offset
        yhat = yhat * w[None, :]
    if HAS_B:
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        yhat = yhat + b[None, :]
    return yhat


@triton.jit
def _tile(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, tile, R, N, sx, sr, ss, sy, eps, offset,
          k0, k1, p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RMS: tl.constexpr, HAS_RES: tl.constexpr,
          HAS_W: tl.constexpr, HAS_B: tl.constexpr, STORE_SUM: tl.constexpr, STORE_STATS: tl.constexpr,
          ONE_CHUNK: tl.constexpr, INDEX_64: tl.constexpr, DROPOUT: tl.constexpr):
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < R
    if INDEX_64:
        rows = rows.to(tl.int64)
    xoff = rows * sx
    roff = rows * sr
    soff = rows * ss
    yoff = rows * sy
    qoff = rows * ((N + 3) // 4)  # each row's first Philox counter (the dropout's: 4 columns a draw)
    S_TY = y_ptr.dtype.element_ty  # y has s's dtype
    if ONE_CHUNK:
        cols = tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = rmask[:, None] & cmask[None, :]
        s = _load_sum(x_ptr, r_ptr, xoff, roff, cols, mask, qoff, k0, k1, p, HAS_RES, S_TY, DROPOUT, INDEX_64)
        if STORE_SUM:
            tl.store(s_ptr + soff[:, None] + cols[None, :], s.to(S_TY), mask=mask)
        if RMS:
            rstd = 1.0 / tl.sqrt(_rowsum(s * s) / N + eps)
            yhat = s * rstd[:, None]
        else:
            mean = _rowsum(s) / N
            d = tl.where(mask, s - mean[:, None], 0.0)
            rstd = 1.0 / tl.sqrt(_rowsum(d * d) / N + eps)
            yhat = d * rstd[:, None]
        y = _scale_shift(yhat, w_ptr, b_ptr, cols, cmask, offset, RMS, HAS_W, HAS_B)
        tl.store(y_ptr + yoff[:, None] + cols[None, :], y.to(S_TY), mask=mask)
    else:
        mean = tl.full((BLOCK_M,), 0.0, tl.float32)
        m2 = tl.full((BLOCK_M,), 0.0, tl.float32)
        for c in range(0, N, BLOCK_N):
            cols = c + tl.arange(0, BLOCK_N)
            cmask = cols < N
            mask = rmask[:, None] & cmask[None, :]
            s = _load_sum(x_ptr, r_ptr, xoff, roff, cols, mask, qoff + c // 4, k0, k1, p, HAS_RES, S_TY, DROPOUT,
                          INDEX_64)
            if STORE_SUM:
                tl.store(s_ptr + soff[:, None] + cols[None, :], s.to(S_TY), mask=mask)
            if RMS:
                m2 += _rowsum(s * s)
            else:
                nb = tl.minimum(N - c, BLOCK_N).to(tl.float32)  # valid columns in this chunk
                na = c * 1.0  # columns merged so far (every earlier chunk is full)
                cm = _rowsum(s) / nb
                d = tl.where(mask, s - cm[:, None], 0.0)
                delta = cm - mean
                n = na + nb
                mean += delta * (nb / n)
                m2 += _rowsum(d * d) + delta * delta * (na * nb / n)
        rstd = 1.0 / tl.sqrt(m2 / N + eps)
        for c in range(0, N, BLOCK_N):
            cols = c + tl.arange(0, BLOCK_N)
            cmask = cols < N
            mask = rmask[:, None] & cmask[None, :]
            s = _load_sum(x_ptr, r_ptr, xoff, roff, cols, mask, qoff + c // 4, k0, k1, p, HAS_RES, S_TY, DROPOUT,
                          INDEX_64)
            if RMS:
                yhat = s * rstd[:, None]
            else:
                yhat = (s - mean[:, None]) * rstd[:, None]
            y = _scale_shift(yhat, w_ptr, b_ptr, cols, cmask, offset, RMS, HAS_W, HAS_B)
            tl.store(y_ptr + yoff[:, None] + cols[None, :], y.to(S_TY), mask=mask)
    if STORE_STATS:
        if not RMS:
            tl.store(mean_ptr + rows, mean, mask=rmask)
        tl.store(rstd_ptr + rows, rstd, mask=rmask)


@triton.jit
def _add_norm(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, R, N, sx, sr, ss, sy, eps, offset,
              n_tiles, nprog, k0, k1, p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RMS: tl.constexpr,
              HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, STORE_SUM: tl.constexpr,
              STORE_STATS: tl.constexpr, ONE_CHUNK: tl.constexpr, PERSISTENT: tl.constexpr,
              INDEX_64: tl.constexpr, DROPOUT: tl.constexpr):
    """The body of both forward kernels: ``eps``, ``offset`` and ``p`` taken as fp32 (Inductor
    passes a Python float as fp64, which would carry every element's arithmetic to fp64)."""
    eps = tl.cast(eps, tl.float32)
    offset = tl.cast(offset, tl.float32)
    p = tl.cast(p, tl.float32)
    pid = tl.program_id(0)
    if PERSISTENT:
        for tile in range(pid, n_tiles, nprog):
            _tile(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, tile, R, N, sx, sr, ss, sy,
                  eps, offset, k0, k1, p, BLOCK_M, BLOCK_N, RMS, HAS_RES, HAS_W, HAS_B, STORE_SUM, STORE_STATS,
                  ONE_CHUNK, INDEX_64, DROPOUT)
    else:
        _tile(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, pid, R, N, sx, sr, ss, sy,
              eps, offset, k0, k1, p, BLOCK_M, BLOCK_N, RMS, HAS_RES, HAS_W, HAS_B, STORE_SUM, STORE_STATS,
              ONE_CHUNK, INDEX_64, DROPOUT)


@triton.jit
def add_norm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr,
                    R, N, sx, sr, ss, sy, eps, offset, n_tiles, nprog,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RMS: tl.constexpr, HAS_RES: tl.constexpr,
                    HAS_W: tl.constexpr, HAS_B: tl.constexpr, STORE_SUM: tl.constexpr,
                    STORE_STATS: tl.constexpr, ONE_CHUNK: tl.constexpr, PERSISTENT: tl.constexpr,
                    INDEX_64: tl.constexpr):
    """y = norm(x + residual) over rows of length N; s = x + residual stored when STORE_SUM."""
    _add_norm(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, R, N, sx, sr, ss, sy, eps, offset,
              n_tiles, nprog, 0, 0, 0.0, BLOCK_M, BLOCK_N, RMS, HAS_RES, HAS_W, HAS_B, STORE_SUM, STORE_STATS,
              ONE_CHUNK, PERSISTENT, INDEX_64, False)


@triton.jit
def add_norm_dropout_kernel(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, seed_ptr,
                            R, N, sx, sr, ss, sy, eps, offset, p, n_tiles, nprog,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RMS: tl.constexpr,
                            HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                            STORE_SUM: tl.constexpr, STORE_STATS: tl.constexpr, ONE_CHUNK: tl.constexpr,
                            PERSISTENT: tl.constexpr, INDEX_64: tl.constexpr):
    """y = norm(dropout(x, p) + residual), s = dropout(x, p) + residual (``add_norm_kernel``'s
    flags): the mask drawn from the int64 seed at ``seed_ptr`` (:func:`_keep`: one draw per four columns) and
    never stored; the backward draws it again from the same seed. Needs HAS_RES."""
    k0, k1 = _seed_keys(seed_ptr)
    _add_norm(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, R, N, sx, sr, ss, sy, eps, offset,
              n_tiles, nprog, k0, k1, p, BLOCK_M, BLOCK_N, RMS, HAS_RES, HAS_W, HAS_B, STORE_SUM, STORE_STATS,
              ONE_CHUNK, PERSISTENT, INDEX_64, True)


# -- backward -------------------------------------------------------------------------------------
@triton.jit
def _colsum(v):
    """Sum over the rows of a tile (``tl.sum(v, 0)``, spelled as ``_rowsum`` is)."""
    return tl.reduce(v, 0, _add)


@triton.jit
def _bwd_load(s_ptr, x_ptr, r_ptr, dy_ptr, w_ptr, soff, xoff, roff, dyoff, cols, cmask, mask, mean, rstd, offset,
              qoff, k0, k1, p, RMS: tl.constexpr, HAS_S: tl.constexpr, HAS_RES: tl.constexpr,
              HAS_W: tl.constexpr, S_TY: tl.constexpr, DROPOUT: tl.constexpr, INDEX_64: tl.constexpr):
    """(xhat, dy, g = dy * w) of one tile in fp32, 0 where masked: s read (``HAS_S``) or
    recomputed from x + residual, rounded to s's dtype as the forward rounded it."""
    if HAS_S:
        s = tl.load(s_ptr + soff[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    else:
        s = _load_sum(x_ptr, r_ptr, xoff, roff, cols, mask, qoff, k0, k1, p, HAS_RES, S_TY, DROPOUT, INDEX_64)
    if RMS:
        xhat = s * rstd[:, None]
    else:
        xhat = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
    dy = tl.load(dy_ptr + dyoff[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = dy
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        if RMS:
            w = w + offset
        g = dy * w[None, :]
    return xhat, dy, g


@triton.jit
def _bwd_store(d, ds_ptr, dx_ptr, dr_ptr, dsoff, dxoff, droff, cols, mask, qoff, k0, k1, p,
               HAS_DS: tl.constexpr, STORE_X: tl.constexpr, STORE_R: tl.constexpr, DROPOUT: tl.constexpr,
               INDEX_64: tl.constexpr):
    """d(s) (+ the returned sum's gradient) stored as d(x) and/or d(residual), each in its dtype.
    ``DROPOUT``: d(x) is dropout's backward of d(s) rounded to its dtype (kept elements times
    ``1 / (1 - p)``, the others 0; the forward's mask, drawn again)."""
    if HAS_DS:
        d += tl.load(ds_ptr + dsoff[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if STORE_X:
        dx = d
        if DROPOUT:
            DX_TY = dx_ptr.dtype.element_ty
            dx = tl.where(_keep(k0, k1, p, qoff, cols, INDEX_64), _round_to(d, DX_TY) * (1.0 / (1.0 - p)), 0.0)
        tl.store(dx_ptr + dxoff[:, None] + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if STORE_R:
        tl.store(dr_ptr + droff[:, None] + cols[None, :], d.to(dr_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_norm_bwd(s_ptr, x_ptr, r_ptr, dy_ptr, ds_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dr_ptr, part_ptr,
                  R, N, ss, sx, sr, sdy, sds, sdx, sdr, offset, db_at, part_row, n_tiles, nprog, k0, k1, p,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RMS: tl.constexpr, HAS_S: tl.constexpr,
                  HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_DS: tl.constexpr, STORE_X: tl.constexpr,
                  STORE_R: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
                  ONE_CHUNK: tl.constexpr, INDEX_64: tl.constexpr, S_TY: tl.constexpr, DROPOUT: tl.constexpr):
    """d(s) = rstd * (g - mean(g) - xhat * mean(g * xhat)) + ds per row (RMSNorm: no mean(g));
    d(w) / d(b) partial sums of dy * xhat / dy over this program's rows into ``part_ptr[pid]``.

    Program ``pid`` takes row tiles ``pid, pid + nprog, ...`` (the grid never exceeds the tiles).
    ``ONE_CHUNK``: the tile's row is held on chip; d(w)/d(b) accumulate in registers over the
    program's tiles and are stored once (``part`` needs no initialisation). Otherwise each tile
    walks its row twice in chunks of ``BLOCK_N`` (pass 1: the two row sums; pass 2: d(s)), and
    the d(w)/d(b) partials are atomically added into this program's own (zeroed) part row:
    coherent where a plain store read back by another thread of the program would not be."""
    offset = tl.cast(offset, tl.float32)  # fp32 whoever launches it (as add_norm_kernel)
    p = tl.cast(p, tl.float32)
    pid = tl.program_id(0)
    pbase = pid * part_row
    if INDEX_64:
        pbase = pbase.to(tl.int64)
    cols0 = tl.arange(0, BLOCK_N)
    acc_w = tl.full((BLOCK_N,), 0.0, tl.float32)
    acc_b = tl.full((BLOCK_N,), 0.0, tl.float32)
    for tile in range(pid, n_tiles, nprog):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < R
        if INDEX_64:
            rows = rows.to(tl.int64)
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
        if RMS:
            mean = rstd
        else:
            mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
        soff, xoff, roff, dyoff = rows * ss, rows * sx, rows * sr, rows * sdy
        dsoff, dxoff, droff = rows * sds, rows * sdx, rows * sdr
        qoff = rows * ((N + 3) // 4)  # as the forward's
        if ONE_CHUNK:
            cmask = cols0 < N
            mask = rmask[:, None] & cmask[None, :]
            xhat, dy, g = _bwd_load(s_ptr, x_ptr, r_ptr, dy_ptr, w_ptr, soff, xoff, roff, dyoff, cols0, cmask, mask,
                                    mean, rstd, offset, qoff, k0, k1, p, RMS, HAS_S, HAS_RES, HAS_W, S_TY, DROPOUT,
                                    INDEX_64)
            if NEED_DW:
                acc_w += _colsum(dy * xhat)
            if NEED_DB:
                acc_b += _colsum(dy)
            if STORE_X or STORE_R:
                c1 = _rowsum(g * xhat) / N
                d = g - xhat * c1[:, None]
                if not RMS:
                    d = d - (_rowsum(g) / N)[:, None]
                _bwd_store(d * rstd[:, None], ds_ptr, dx_ptr, dr_ptr, dsoff, dxoff, droff, cols0, mask, qoff, k0, k1, p,
                           HAS_DS, STORE_X, STORE_R, DROPOUT, INDEX_64)
        else:
            c1 = tl.full((BLOCK_M,), 0.0, tl.float32)
            c2 = tl.full((BLOCK_M,), 0.0, tl.float32)
            for c in range(0, N, BLOCK_N):
                cols = c + cols0
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                xhat, dy, g = _bwd_load(s_ptr, x_ptr, r_ptr, dy_ptr, w_ptr, soff, xoff, roff, dyoff, cols, cmask,
                                        mask, mean, rstd, offset, qoff + c // 4, k0, k1, p, RMS, HAS_S, HAS_RES, HAS_W, S_TY,
                                        DROPOUT, INDEX_64)
                c1 += _rowsum(g * xhat)
                c2 += _rowsum(g)
                if NEED_DW:
                    tl.atomic_add(part_ptr + pbase + cols, _colsum(dy * xhat), mask=cmask)
                if NEED_DB:
                    tl.atomic_add(part_ptr + pbase + db_at + cols, _colsum(dy), mask=cmask)
            if STORE_X or STORE_R:
                c1 = c1 / N
                c2 = c2 / N
                for c in range(0, N, BLOCK_N):
                    cols = c + cols0
                    cmask = cols < N
                    mask = rmask[:, None] & cmask[None, :]
                    xhat, dy, g = _bwd_load(s_ptr, x_ptr, r_ptr, dy_ptr, w_ptr, soff, xoff, roff, dyoff, cols, cmask,
                                            mask, mean, rstd, offset, qoff + c // 4, k0, k1, p, RMS, HAS_S, HAS_RES, HAS_W,
                                            S_TY, DROPOUT, INDEX_64)
                    d = g - xhat * c1[:, None]
                    if not RMS:
                        d = d - c2[:, None]
                    _bwd_store(d * rstd[:, None], ds_ptr, dx_ptr, dr_ptr, dsoff, dxoff, droff, cols, mask,
                               qoff + c // 4, k0, k1, p, HAS_DS, STORE_X, STORE_R, DROPOUT, INDEX_64)
    if ONE_CHUNK:
        cmask = cols0 < N
        if NEED_DW:
            tl.store(part_ptr + pbase + cols0, acc_w, mask=cmask)
        if NEED_DB:
            tl.store(part_ptr + pbase + db_at + cols0, acc_b, mask=cmask)


@triton.jit
def add_norm_bwd_kernel(s_ptr, x_ptr, r_ptr, dy_ptr, ds_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dr_ptr, part_ptr,
                        R, N, ss, sx, sr, sdy, sds, sdx, sdr, offset, db_at, part_row, n_tiles, nprog,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RMS: tl.constexpr, HAS_S: tl.constexpr,
                        HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_DS: tl.constexpr, STORE_X: tl.constexpr,
                        STORE_R: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
                        ONE_CHUNK: tl.constexpr, INDEX_64: tl.constexpr, S_TY: tl.constexpr):
    """d(s) = rstd * (g - mean(g) - xhat * mean(g * xhat)) + ds per row (RMSNorm: no mean(g));
    d(w) / d(b) partial sums of dy * xhat / dy over this program's rows into ``part_ptr[pid]``
    (:func:`_add_norm_bwd`)."""
    _add_norm_bwd(s_ptr, x_ptr, r_ptr, dy_ptr, ds_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dr_ptr, part_ptr,
                  R, N, ss, sx, sr, sdy, sds, sdx, sdr, offset, db_at, part_row, n_tiles, nprog, 0, 0, 0.0,
                  BLOCK_M, BLOCK_N, RMS, HAS_S, HAS_RES, HAS_W, HAS_DS, STORE_X, STORE_R, NEED_DW, NEED_DB,
                  ONE_CHUNK, INDEX_64, S_TY, False)


@triton.jit
def add_norm_dropout_bwd_kernel(s_ptr, x_ptr, r_ptr, dy_ptr, ds_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dr_ptr,
                                part_ptr, seed_ptr, R, N, ss, sx, sr, sdy, sds, sdx, sdr, offset, p, db_at,
                                part_row, n_tiles, nprog, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                RMS: tl.constexpr, HAS_S: tl.constexpr, HAS_RES: tl.constexpr,
                                HAS_W: tl.constexpr, HAS_DS: tl.constexpr, STORE_X: tl.constexpr,
                                STORE_R: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
                                ONE_CHUNK: tl.constexpr, INDEX_64: tl.constexpr, S_TY: tl.constexpr):
    """The backward of ``add_norm_dropout_kernel``: as ``add_norm_bwd_kernel``, with d(x) the
    dropout's backward of d(s) (the mask drawn again from the forward's seed at ``seed_ptr``) and
    d(residual) = d(s): stored apart (``STORE_X`` and ``STORE_R``)."""
    k0, k1 = _seed_keys(seed_ptr)
    _add_norm_bwd(s_ptr, x_ptr, r_ptr, dy_ptr, ds_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dr_ptr, part_ptr,
                  R, N, ss, sx, sr, sdy, sds, sdx, sdr, offset, db_at, part_row, n_tiles, nprog, k0, k1, p,
                  BLOCK_M, BLOCK_N, RMS, HAS_S, HAS_RES, HAS_W, HAS_DS, STORE_X, STORE_R, NEED_DW, NEED_DB,
                  ONE_CHUNK, INDEX_64, S_TY, True)


@triton.jit
def part_sum_kernel(part_ptr, dw_ptr, db_ptr, P, N, db_at, part_row, n_blocks, nprog,
                    NEED_DW: tl.constexpr, NEED_DB: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                    INDEX_64: tl.constexpr, W_TY: tl.constexpr, B_TY: tl.constexpr):
    """d(w) / d(b) from ``add_norm_bwd_kernel``'s per-program partials ``part[P, K, N]`` (fp32):
    each of the ``n_blocks`` column blocks (program ``pid`` takes blocks ``pid, pid + nprog, ...``)
    is summed over the P programs' rows in a fixed order (steps of ``BLOCK_P`` rows, each reduced
    by ``_colsum``) and written once, rounded to nearest in the parameters' dtypes ``W_TY`` /
    ``B_TY``: the reduction and the cast in one launch."""
    pid = tl.program_id(0)
    for blk in range(pid, n_blocks, nprog):
        cols = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        acc_w = tl.full((BLOCK_N,), 0.0, tl.float32)
        acc_b = tl.full((BLOCK_N,), 0.0, tl.float32)
        for p0 in range(0, P, BLOCK_P):
            prow = p0 + tl.arange(0, BLOCK_P)
            mask = (prow < P)[:, None] & cmask[None, :]
            if INDEX_64:
                prow = prow.to(tl.int64)
            off = prow[:, None] * part_row + cols[None, :]
            if NEED_DW:
                acc_w += _colsum(tl.load(part_ptr + off, mask=mask, other=0.0))
            if NEED_DB:
                acc_b += _colsum(tl.load(part_ptr + off + db_at, mask=mask, other=0.0))
        if NEED_DW:
            tl.store(dw_ptr + cols, _round_to(acc_w, W_TY).to(W_TY), mask=cmask)
        if NEED_DB:
            tl.store(db_ptr + cols, _round_to(acc_b, B_TY).to(B_TY), mask=cmask)
