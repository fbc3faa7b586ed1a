"""Triton source of ``rotary_embedding``: rotary position embeddings of q and k in one launch.

Per row ``x`` (one head of one token: the last dim, ``D`` wide) and its ``cos`` / ``sin`` rows
(``R = 2 * HALF`` wide, ``R <= D``), as transformers' ``apply_rotary_pos_emb`` computes it
(``rotate_half``: the first half of the rotary part paired with the second; ``p(c)`` is ``c``'s
partner, ``c + HALF`` for a "first" column ``c < HALF``, ``c - HALF`` for the others):

    out[c] = x[c] * cos[c] - x[p(c)] * sin[c]              c first
    out[c] = x[c] * cos[c] + x[p(c)] * sin[c]              c second, c < R
    out[c] = x[c]                                          R <= c < D   (partial rotary: passed)

``INTERLEAVED``: pairs of adjacent columns instead (GPT-J's ``rotate_every_two``, Cohere's and
GLM's ``rotate_half``): the first columns are the even ones, ``p(c) = c ^ 1``. ``SPLIT_PAIRS``
(the table's ``PAIRS: "split"``, the default): the tile is loaded once, split in registers into
its even and odd columns (``tl.split`` of a ``(.., BLOCK_D / 2, 2)`` view) and joined back for the
store. A load at ``c ^ 1`` is a gather Triton does not vectorize: 3-7x slower than the halves'
kernel on an H200, where the split form runs at the halves' speed
(results/2026-11-28-h200-adjacent-pair-rotary). Otherwise (``PAIRS: "gather"``, the npu table:
the split form needs 230 KiB of Ascend910B1's 192 KiB unified buffer at a 2048-element fp16
tile) the partner is gathered as the halves' is.

``BACKWARD``: the transposed rotation, the gradient of x from the output's gradient ``x``:

    dx[c] = g[c] * cos[c] + g[p(c)] * sin[p(c)]            c first
    dx[c] = g[c] * cos[c] - g[p(c)] * sin[p(c)]            c second, c < R

Products and the sum in fp32, one rounding at the store (torch's formula rounds after each of its
three ops, so results may differ from it by an ulp of the dtype; both are compared with float64).

Geometry: q (and k) are taken as rows over up to three leading dims ``(A, B, C)`` with a stride
each, unit column stride; ``cos`` / ``sin`` are addressed with strides over q's (k's) leading
dims, 0 along a broadcast dim (the heads, usually), so each program reads the rows it needs and
the cache serves the repeats. One launch rotates both: row tiles ``[0, Q_TILES)`` are q's, the
rest k's. ``PERSISTENT``: fewer programs than tiles (Ascend: one per vector core); program ``pid``
takes tiles ``pid, pid + nprog, ...``. ``INDEX_64``: offsets can pass 2**31 - 1.

Rules for kernels here (they also run under the in-process interpreter): call only helpers of
this module and ``tl`` builtins, take the program count as an argument, no ``tl.cdiv``.
"""

import triton
import triton.language as tl


@triton.jit
def _rotate_tile(x_ptr, o_ptr, cos_ptr, sin_ptr, tile, A, B, C, sxa, sxb, sxc, soa, sob, soc, sca, scb, scc,
                 D, HALF, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BACKWARD: tl.constexpr,
                 INTERLEAVED: tl.constexpr, SPLIT_PAIRS: tl.constexpr, INDEX_64: tl.constexpr):
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    if INDEX_64:
        rows = rows.to(tl.int64)
    live = rows < A * B * C
    a = rows // (B * C)
    b = (rows // C) % B
    c = rows % C
    x_row = a * sxa + b * sxb + c * sxc
    o_row = a * soa + b * sob + c * soc
    cs_row = a * sca + b * scb + c * scc
    cols = tl.arange(0, BLOCK_D)
    rotary = cols < 2 * HALF
    on_row = live[:, None]
    in_row = on_row & (cols < D)[None, :]
    in_rot = on_row & rotary[None, :]
    x = tl.load(x_ptr + x_row[:, None] + cols[None, :], mask=in_row, other=0.0).to(tl.float32)
    co = tl.load(cos_ptr + cs_row[:, None] + cols[None, :], mask=in_rot, other=1.0).to(tl.float32)
    si = tl.load(sin_ptr + cs_row[:, None] + cols[None, :], mask=in_rot, other=0.0).to(tl.float32)
    if INTERLEAVED and SPLIT_PAIRS:  # the pairs in registers: each row split into even and odd columns
        xe, xo = tl.split(tl.reshape(x, (BLOCK_R, BLOCK_D // 2, 2)))
        ce, cd = tl.split(tl.reshape(co, (BLOCK_R, BLOCK_D // 2, 2)))
        se, sd = tl.split(tl.reshape(si, (BLOCK_R, BLOCK_D // 2, 2)))
        if BACKWARD:
            oe = xe * ce + xo * sd
            od = xo * cd - xe * se
        else:
            oe = xe * ce - xo * se
            od = xo * cd + xe * sd
        out = tl.reshape(tl.join(oe, od), (BLOCK_R, BLOCK_D))
    else:  # the partner gathered: at c ^ 1 (adjacent pairs), at c +- HALF (the halves)
        if INTERLEAVED:
            first = (cols % 2) == 0
            partner = tl.where(first, cols + 1, cols - 1)
        else:
            first = cols < HALF
            partner = tl.where(first, cols + HALF, cols - HALF)
        xp = tl.load(x_ptr + x_row[:, None] + partner[None, :], mask=in_rot, other=0.0).to(tl.float32)
        if BACKWARD:
            si = tl.load(sin_ptr + cs_row[:, None] + partner[None, :], mask=in_rot, other=0.0).to(tl.float32)
            sign = tl.where(first, 1.0, -1.0)
        else:
            sign = tl.where(first, -1.0, 1.0)
        out = x * co + sign[None, :] * (xp * si)
    tl.store(o_ptr + o_row[:, None] + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def rotary_kernel(q_ptr, qo_ptr, k_ptr, ko_ptr, cos_ptr, sin_ptr,
                  QA, QB, QC, sqa, sqb, sqc, soqa, soqb, soqc, scqa, scqb, scqc,
                  KA, KB, KC, ska, skb, skc, soka, sokb, sokc, scka, sckb, sckc,
                  D, HALF, Q_TILES, N_TILES, N_PROGRAMS,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BACKWARD: tl.constexpr,
                  INTERLEAVED: tl.constexpr, SPLIT_PAIRS: tl.constexpr, PERSISTENT: tl.constexpr,
                  INDEX_64: tl.constexpr):
    pid = tl.program_id(0)
    if PERSISTENT:
        for t in range(pid, N_TILES, N_PROGRAMS):
            if t < Q_TILES:
                _rotate_tile(q_ptr, qo_ptr, cos_ptr, sin_ptr, t, QA, QB, QC, sqa, sqb, sqc, soqa, soqb, soqc,
                             scqa, scqb, scqc, D, HALF, BLOCK_R, BLOCK_D, BACKWARD, INTERLEAVED, SPLIT_PAIRS, INDEX_64)
            else:
                _rotate_tile(k_ptr, ko_ptr, cos_ptr, sin_ptr, t - Q_TILES, KA, KB, KC, ska, skb, skc, soka, sokb,
                             sokc, scka, sckb, sckc, D, HALF, BLOCK_R, BLOCK_D, BACKWARD, INTERLEAVED, SPLIT_PAIRS, INDEX_64)
    else:
        if pid < Q_TILES:
            _rotate_tile(q_ptr, qo_ptr, cos_ptr, sin_ptr, pid, QA, QB, QC, sqa, sqb, sqc, soqa, soqb, soqc,
                         scqa, scqb, scqc, D, HALF, BLOCK_R, BLOCK_D, BACKWARD, INTERLEAVED, SPLIT_PAIRS, INDEX_64)
        else:
            _rotate_tile(k_ptr, ko_ptr, cos_ptr, sin_ptr, pid - Q_TILES, KA, KB, KC, ska, skb, skc, soka, sokb,
                         sokc, scka, sckb, sckc, D, HALF, BLOCK_R, BLOCK_D, BACKWARD, INTERLEAVED, SPLIT_PAIRS, INDEX_64)
