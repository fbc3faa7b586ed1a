"""Triton source of the element-wise binary kernels behind ``add`` and ``broadcast``.

One source for every backend. What differs per backend arrives as launch arguments:

* ``PERSISTENT``: the backend launched fewer programs than tiles (Ascend: one per vector core),
  so each program walks tiles ``pid, pid + nprog, ...``; on CUDA every tile has its own program.
* ``BLOCK``/``SUB`` (flat) and ``BLOCK_M``/``BLOCK_N``/``SUB_M`` (tiled) come from the op's
  tuning table for that backend; ``SUB`` bounds what one iteration keeps on chip (Ascend's
  192 KiB unified buffer), on CUDA ``SUB == BLOCK``.
* ``INDEX_64``: offsets can pass 2**31 - 1, so index arithmetic is done in int64 (slow on Ascend,
  so only when needed).

Operand modes (``X_MODE``/``Y_MODE``): 0 a strided tile, 1 a row vector broadcast down the rows
(the bias fast path: loaded once per tile), 2 a scalar passed by value.

Rules for kernels here (they also run under the in-process interpreter): call only helpers of
this module and ``tl`` builtins, take the program count as an argument, no ``tl.cdiv``.
"""

import triton
import triton.language as tl


@triton.jit
def _combine(x, y, alpha, COMPUTE: tl.constexpr, HAS_ALPHA: tl.constexpr):
    x = x.to(COMPUTE)
    y = y.to(COMPUTE)
    if HAS_ALPHA:
        y = y * alpha
    return x + y


@triton.jit
def _flat_chunk(x_ptr, y_ptr, out_ptr, offs, n, alpha,
                X_MODE: tl.constexpr, Y_MODE: tl.constexpr, COMPUTE: tl.constexpr,
                HAS_ALPHA: tl.constexpr, EVEN: tl.constexpr):
    if EVEN:
        if X_MODE == 2:
            x = x_ptr
        else:
            x = tl.load(x_ptr + offs)
        if Y_MODE == 2:
            y = y_ptr
        else:
            y = tl.load(y_ptr + offs)
        r = _combine(x, y, alpha, COMPUTE, HAS_ALPHA)
        tl.store(out_ptr + offs, r.to(out_ptr.dtype.element_ty))
    else:
        mask = offs < n
        if X_MODE == 2:
            x = x_ptr
        else:
            x = tl.load(x_ptr + offs, mask=mask)
        if Y_MODE == 2:
            y = y_ptr
        else:
            y = tl.load(y_ptr + offs, mask=mask)
        r = _combine(x, y, alpha, COMPUTE, HAS_ALPHA)
        tl.store(out_ptr + offs, r.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _flat_block(x_ptr, y_ptr, out_ptr, blk, n, alpha,
                BLOCK: tl.constexpr, SUB: tl.constexpr,
                X_MODE: tl.constexpr, Y_MODE: tl.constexpr, COMPUTE: tl.constexpr,
                HAS_ALPHA: tl.constexpr, EVEN: tl.constexpr):
    base = blk * BLOCK
    for s in range(0, BLOCK, SUB):
        offs = base + s + tl.arange(0, SUB)
        _flat_chunk(x_ptr, y_ptr, out_ptr, offs, n, alpha, X_MODE, Y_MODE, COMPUTE, HAS_ALPHA, EVEN)


@triton.jit
def binary_flat_kernel(x_ptr, y_ptr, out_ptr, n, alpha, n_blocks, nprog,
                       BLOCK: tl.constexpr, SUB: tl.constexpr,
                       X_MODE: tl.constexpr, Y_MODE: tl.constexpr, COMPUTE: tl.constexpr,
                       HAS_ALPHA: tl.constexpr, EVEN: tl.constexpr,
                       PERSISTENT: tl.constexpr, INDEX_64: tl.constexpr):
    """out[i] = x[i] + alpha * y[i] over contiguous operands of one shape (or scalars)."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    if PERSISTENT:
        for blk in range(pid, n_blocks, nprog):
            _flat_block(x_ptr, y_ptr, out_ptr, blk, n, alpha, BLOCK, SUB,
                        X_MODE, Y_MODE, COMPUTE, HAS_ALPHA, EVEN)
    else:
        _flat_block(x_ptr, y_ptr, out_ptr, pid, n, alpha, BLOCK, SUB,
                    X_MODE, Y_MODE, COMPUTE, HAS_ALPHA, EVEN)


@triton.jit
def _row_offsets(rows, d1, d2, s0, s1, s2):
    """Offsets of flat row indices over the three leading (collapsed) dims of size (., d1, d2)."""
    i2 = rows % d2
    t = rows // d2
    i1 = t % d1
    i0 = t // d1
    return i0 * s0 + i1 * s1 + i2 * s2


@triton.jit
def _operand_tile(ptr, row, rows, cols, mask, d1, d2, s0, s1, s2, s3, MODE: tl.constexpr, EVEN: tl.constexpr):
    """The operand's values on a (rows x cols) tile; ``row`` is the preloaded row in mode 1."""
    if MODE == 0:
        off = _row_offsets(rows, d1, d2, s0, s1, s2)
        if EVEN:
            v = tl.load(ptr + off[:, None] + cols[None, :] * s3)
        else:
            v = tl.load(ptr + off[:, None] + cols[None, :] * s3, mask=mask)
    elif MODE == 1:
        v = row[None, :]
    else:
        v = ptr
    return v


@triton.jit
def _tile(x_ptr, y_ptr, out_ptr, tile, alpha, R, N, tiles_n, d1, d2,
          xs0, xs1, xs2, xs3, ys0, ys1, ys2, ys3, os0, os1, os2, os3,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr,
          X_MODE: tl.constexpr, Y_MODE: tl.constexpr, COMPUTE: tl.constexpr, HAS_ALPHA: tl.constexpr,
          EVEN: tl.constexpr):
    tm = tile // tiles_n
    tn = tile % tiles_n
    cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    x_row = x_ptr
    y_row = y_ptr
    if X_MODE == 1:
        x_row = tl.load(x_ptr + cols * xs3) if EVEN else tl.load(x_ptr + cols * xs3, mask=cmask)
    if Y_MODE == 1:
        y_row = tl.load(y_ptr + cols * ys3) if EVEN else tl.load(y_ptr + cols * ys3, mask=cmask)
    for s in range(0, BLOCK_M, SUB_M):
        rows = tm * BLOCK_M + s + tl.arange(0, SUB_M)
        mask = (rows < R)[:, None] & cmask[None, :]
        x = _operand_tile(x_ptr, x_row, rows, cols, mask, d1, d2, xs0, xs1, xs2, xs3, X_MODE, EVEN)
        y = _operand_tile(y_ptr, y_row, rows, cols, mask, d1, d2, ys0, ys1, ys2, ys3, Y_MODE, EVEN)
        r = tl.broadcast_to(_combine(x, y, alpha, COMPUTE, HAS_ALPHA), (SUB_M, BLOCK_N))
        off = _row_offsets(rows, d1, d2, os0, os1, os2)
        if EVEN:
            tl.store(out_ptr + off[:, None] + cols[None, :] * os3, r.to(out_ptr.dtype.element_ty))
        else:
            tl.store(out_ptr + off[:, None] + cols[None, :] * os3, r.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def binary_tiled_kernel(x_ptr, y_ptr, out_ptr, alpha, R, N, tiles_n, n_tiles, nprog, d1, d2,
                        xs0, xs1, xs2, xs3, ys0, ys1, ys2, ys3, os0, os1, os2, os3,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr,
                        X_MODE: tl.constexpr, Y_MODE: tl.constexpr, COMPUTE: tl.constexpr,
                        HAS_ALPHA: tl.constexpr, EVEN: tl.constexpr, PERSISTENT: tl.constexpr,
                        INDEX_64: tl.constexpr):
    """out = x + alpha * y over up to four (collapsed) dims with any strides, broadcasting included.

    Rows are the three leading dims flattened (sizes ``(R / (d1 * d2), d1, d2)``), columns the
    last dim (size ``N``). Each operand has its own four element strides (0 where broadcast).
    """
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    if PERSISTENT:
        for tile in range(pid, n_tiles, nprog):
            _tile(x_ptr, y_ptr, out_ptr, tile, alpha, R, N, tiles_n, d1, d2,
                  xs0, xs1, xs2, xs3, ys0, ys1, ys2, ys3, os0, os1, os2, os3,
                  BLOCK_M, BLOCK_N, SUB_M, X_MODE, Y_MODE, COMPUTE, HAS_ALPHA, EVEN)
    else:
        _tile(x_ptr, y_ptr, out_ptr, pid, alpha, R, N, tiles_n, d1, d2,
              xs0, xs1, xs2, xs3, ys0, ys1, ys2, ys3, os0, os1, os2, os3,
              BLOCK_M, BLOCK_N, SUB_M, X_MODE, Y_MODE, COMPUTE, HAS_ALPHA, EVEN)
