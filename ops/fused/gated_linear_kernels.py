"""Triton sources of ``gated_linear``: ``act(x @ Wg.T + bg) * (x @ Wu.T + bu)`` in one pass.

``gated_linear_kernel`` (pointer loads, every backend) and ``gated_linear_tma_kernel`` (sm90+,
tiles through tensor descriptors, fp16/bf16 with K-contiguous weights) compute one output tile
per step: each x tile is loaded once and multiplied into two fp32 accumulators, the gate and the
up projection of the same output columns; the epilogue adds the biases, applies the activation
to the gate and multiplies, and writes the output once. With ``STORE_PRE`` (a call that needs a
gradient) the two pre-activation tiles are written too, so the backward needs no recompute.

``gate_kernel`` is the vendor route's second half: the device's BLAS has written the gate and
up projections (one GEMM against a concatenated weight, or two), and this kernel reads both once
and writes ``act(gate) * up`` (torch's route reads them for the activation, writes act(gate),
reads it back for the multiply). With ``CLAMPED`` it writes GPT-OSS's clamped GLU instead,
``(clamp(up, -limit, limit) + shift) * c * sigmoid(alpha * c)`` for ``c = min(gate, limit)``
(``ALPHA``, ``LIMIT``, ``SHIFT`` runtime floats, unused otherwise; the experts' gate pass,
``gated_activation.py``).

``gate_grad_kernel`` is the backward's element-wise half, for either route: from the output's
gradient and the kept gate and up it writes ``d(gate) = dy * up * act'(gate)`` and ``d(up) = dy *
act(gate)`` (with ``CLAMPED``, the clamped GLU's, zero where a clamp bound, as ``torch.clamp``'s
backward), reading each input once (autograd's mul and activation backwards read them five
times, write three intermediates). Where the weight is concatenated, both land in the halves of
one (M, 2I) buffer, the weight gradient's GEMM operand.

Shared with ``ops/matmul/kernels.py`` (imported, not copied): ``_activation`` and
``_activation_grad`` (the ``ACT`` codes of ``matmul_plan.ACTIVATIONS``) and ``_tma_tile`` (grouped
tile order for L2 reuse). They are re-wrapped with ``triton.jit`` here because the interpreter
backends run a second, interpreted copy of this module, whose kernels may only call helpers of
their own module (``backends/interpreter.py``): wrapping the same Python functions gives the
compiled module compiled helpers and the interpreted copy interpreted ones.
"""

import triton
import triton.language as tl

from xkernels.ops.matmul import kernels as _shared

_activation = triton.jit(_shared._activation.fn)
_activation_grad = triton.jit(_shared._activation_grad.fn)
_tma_tile = triton.jit(_shared._tma_tile.fn)  # one name with its source (Inductor copies a helper by its def)


@triton.jit
def _gated_tile(x_ptr, wg_ptr, wu_ptr, y_ptr, bg_ptr, bu_ptr, g_ptr, u_ptr, tile, M, N, K,
                sxm, sxk, sgn, sgk, sun, suk, sym, syn, s_bg, s_bu,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_UP_BIAS: tl.constexpr, ACT: tl.constexpr,
                EVEN_K: tl.constexpr, INDEX_64: tl.constexpr, UPCAST: tl.constexpr, STORE_PRE: tl.constexpr):
    off_m, off_n = _tma_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if INDEX_64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
        rk = rk.to(tl.int64)
    m_ok = rm < M
    n_ok = rn < N
    x_ptrs = x_ptr + rm[:, None] * sxm + rk[None, :] * sxk
    g_ptrs = wg_ptr + rk[:, None] * sgk + rn[None, :] * sgn  # the (K, N) view of the (N, K) weight
    u_ptrs = wu_ptr + rk[:, None] * suk + rn[None, :] * sun
    acc_g = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    acc_u = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            bg = tl.load(g_ptrs, mask=n_ok[None, :], other=0.0)
            bu = tl.load(u_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = (k + rk) < K
            a = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            bg = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            bu = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:  # the Triton interpreter's dot reads bfloat16 as raw uint16
            a = a.to(tl.float32)
            bg = bg.to(tl.float32)
            bu = bu.to(tl.float32)
        acc_g = tl.dot(a, bg, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, bu, acc_u, input_precision=PRECISION)
        x_ptrs += BLOCK_K * sxk
        g_ptrs += BLOCK_K * sgk
        u_ptrs += BLOCK_K * suk
    if HAS_BIAS:
        acc_g += tl.load(bg_ptr + rn * s_bg, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_UP_BIAS:
        acc_u += tl.load(bu_ptr + rn * s_bu, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    offs = rm[:, None] * sym + rn[None, :] * syn
    if STORE_PRE:  # gate and up for the backward, in y's layout
        tl.store(g_ptr + offs, acc_g.to(g_ptr.dtype.element_ty), mask=mask)
        tl.store(u_ptr + offs, acc_u.to(u_ptr.dtype.element_ty), mask=mask)
    y = _activation(acc_g, 0.0, ACT) * acc_u
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gated_linear_kernel(x_ptr, wg_ptr, wu_ptr, y_ptr, bg_ptr, bu_ptr, g_ptr, u_ptr, M, N, K, n_tiles, nprog,
                        sxm, sxk, sgn, sgk, sun, suk, sym, syn, s_bg, s_bu,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_UP_BIAS: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr,
                        PERSISTENT: tl.constexpr, INDEX_64: tl.constexpr, UPCAST: tl.constexpr,
                        STORE_PRE: tl.constexpr):
    """Y = act(X @ Wg^T + bg) * (X @ Wu^T + bu) over ``n_tiles`` (BLOCK_M, BLOCK_N) tiles of Y
    (M, N), any strides; ``PERSISTENT``: each program walks tiles pid, pid + nprog, ... (the npu
    backends launch one program per AI core)."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    if PERSISTENT:
        for tile in range(pid, n_tiles, nprog):
            _gated_tile(x_ptr, wg_ptr, wu_ptr, y_ptr, bg_ptr, bu_ptr, g_ptr, u_ptr, tile, M, N, K,
                        sxm, sxk, sgn, sgk, sun, suk, sym, syn, s_bg, s_bu, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                        PRECISION, HAS_BIAS, HAS_UP_BIAS, ACT, EVEN_K, INDEX_64, UPCAST, STORE_PRE)
    else:
        _gated_tile(x_ptr, wg_ptr, wu_ptr, y_ptr, bg_ptr, bu_ptr, g_ptr, u_ptr, pid, M, N, K,
                    sxm, sxk, sgn, sgk, sun, suk, sym, syn, s_bg, s_bu, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                    PRECISION, HAS_BIAS, HAS_UP_BIAS, ACT, EVEN_K, INDEX_64, UPCAST, STORE_PRE)


@triton.jit
def _gated_accumulate(x_desc, wg_desc, wu_desc, off_m, off_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    acc_g = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    acc_u = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in range(0, K, BLOCK_K):
        a = x_desc.load([off_m, k])
        acc_g = tl.dot(a, wg_desc.load([off_n, k]).T, acc_g)
        acc_u = tl.dot(a, wu_desc.load([off_n, k]).T, acc_u)
    return acc_g, acc_u


@triton.jit
def _gated_store(y_desc, g_desc, u_desc, bg_ptr, bu_ptr, acc_g, acc_u, off_m, off_n, N, WIDTH: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_UP_BIAS: tl.constexpr, ACT: tl.constexpr, STORE_PRE: tl.constexpr):
    """The biases, the pre-activations (``STORE_PRE``) and ``act(gate) * up`` of ``WIDTH``
    columns from ``off_n``."""
    rn = off_n + tl.arange(0, WIDTH)
    if HAS_BIAS:
        acc_g += tl.load(bg_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if HAS_UP_BIAS:
        acc_u += tl.load(bu_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if STORE_PRE:
        g_desc.store([off_m, off_n], acc_g.to(g_desc.dtype))
        u_desc.store([off_m, off_n], acc_u.to(u_desc.dtype))
    y = _activation(acc_g, 0.0, ACT) * acc_u
    y_desc.store([off_m, off_n], y.to(y_desc.dtype))


@triton.jit
def _gated_epilogue(y_desc, g_desc, u_desc, bg_ptr, bu_ptr, acc_g, acc_u, off_m, off_n, N, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_UP_BIAS: tl.constexpr, ACT: tl.constexpr,
                    STORE_PRE: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr):
    if EPILOGUE_SUBTILE:  # two column halves: half the staging buffer in shared memory
        g0, g1 = tl.split(tl.permute(tl.reshape(acc_g, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        u0, u1 = tl.split(tl.permute(tl.reshape(acc_u, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        _gated_store(y_desc, g_desc, u_desc, bg_ptr, bu_ptr, g0, u0, off_m, off_n, N, BLOCK_N // 2, HAS_BIAS,
                     HAS_UP_BIAS, ACT, STORE_PRE)
        _gated_store(y_desc, g_desc, u_desc, bg_ptr, bu_ptr, g1, u1, off_m, off_n + BLOCK_N // 2, N, BLOCK_N // 2,
                     HAS_BIAS, HAS_UP_BIAS, ACT, STORE_PRE)
    else:
        _gated_store(y_desc, g_desc, u_desc, bg_ptr, bu_ptr, acc_g, acc_u, off_m, off_n, N, BLOCK_N, HAS_BIAS,
                     HAS_UP_BIAS, ACT, STORE_PRE)


@triton.jit
def gated_linear_tma_kernel(x_desc, wg_desc, wu_desc, y_desc, g_desc, u_desc, bg_ptr, bu_ptr, M, N, K,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_UP_BIAS: tl.constexpr,
                            ACT: tl.constexpr, STORE_PRE: tl.constexpr, PERSISTENT: tl.constexpr = False,
                            EPILOGUE_SUBTILE: tl.constexpr = False):
    """The same for 2-D fp16/bf16 x (M, K) and (N, K) K-contiguous weights with 16-byte rows:
    x and weight tiles move through tensor descriptors (the TMA engine), which zero-fill reads
    past the edges and clip writes. Two of ``matmul_tma_kernel``'s schedule options:
    ``PERSISTENT`` (the grid's programs walk tiles ``pid, pid + nprog, ...`` in one flattened
    loop, the next tile's loads overlapping this tile's epilogue) and ``EPILOGUE_SUBTILE`` (y,
    gate and up stored in two column halves: their descriptors' block is (BLOCK_M, BLOCK_N // 2)).
    Not warp specialization: Triton 3.6's pass wrote NaN into this two-accumulator kernel's output
    on an H100 (results/2026-11-28-h100-gated-linear-sweep)."""
    pid = tl.program_id(0)
    if PERSISTENT:
        nprog = tl.num_programs(0)
        tile_c = pid - nprog
        n_tiles = ((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
        for tile in tl.range(pid, n_tiles, nprog, flatten=True):
            off_m, off_n = _tma_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc_g, acc_u = _gated_accumulate(x_desc, wg_desc, wu_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K)
            tile_c += nprog  # the epilogue recounts its tile (matmul_tma_kernel's persistent loop)
            off_cm, off_cn = _tma_tile(tile_c, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            _gated_epilogue(y_desc, g_desc, u_desc, bg_ptr, bu_ptr, acc_g, acc_u, off_cm, off_cn, N, BLOCK_M,
                            BLOCK_N, HAS_BIAS, HAS_UP_BIAS, ACT, STORE_PRE, EPILOGUE_SUBTILE)
    else:
        off_m, off_n = _tma_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc_g, acc_u = _gated_accumulate(x_desc, wg_desc, wu_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K)
        _gated_epilogue(y_desc, g_desc, u_desc, bg_ptr, bu_ptr, acc_g, acc_u, off_m, off_n, N, BLOCK_M, BLOCK_N,
                        HAS_BIAS, HAS_UP_BIAS, ACT, STORE_PRE, EPILOGUE_SUBTILE)


@triton.jit
def gate_kernel(g_ptr, u_ptr, y_ptr, M, N, n_tiles, nprog, sgm, sgn, sum_, sun, sym, syn, ALPHA, LIMIT, SHIFT,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr, PERSISTENT: tl.constexpr,
                INDEX_64: tl.constexpr, CLAMPED: tl.constexpr):
    """Y = act(G) * U (or the clamped GLU) over (BLOCK_M, BLOCK_N) tiles, G and U read once each
    (fp32 math)."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    if PERSISTENT:
        for tile in range(pid, n_tiles, nprog):
            _gate_tile(g_ptr, u_ptr, y_ptr, tile, M, N, sgm, sgn, sum_, sun, sym, syn, ALPHA, LIMIT, SHIFT, BLOCK_M,
                       BLOCK_N, ACT, INDEX_64, CLAMPED)
    else:
        _gate_tile(g_ptr, u_ptr, y_ptr, pid, M, N, sgm, sgn, sum_, sun, sym, syn, ALPHA, LIMIT, SHIFT, BLOCK_M, BLOCK_N,
                   ACT, INDEX_64, CLAMPED)


@triton.jit
def _element_tile(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_64: tl.constexpr):
    """Rows, columns and in-bounds mask of element-wise tile ``tile`` (row-major tile order)."""
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    rm = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    if INDEX_64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
    return rm, rn, (rm < M)[:, None] & (rn < N)[None, :]


@triton.jit
def _clamped(g, u, LIMIT):
    """GPT-OSS's clamps: min(gate, limit), up into [-limit, limit] (NaN stays NaN, as torch.clamp's)."""
    c = tl.where(g > LIMIT, LIMIT, g)
    v = tl.where(u > LIMIT, LIMIT, tl.where(u < -LIMIT, -LIMIT, u))
    return c, v


@triton.jit
def _gate_tile(g_ptr, u_ptr, y_ptr, tile, M, N, sgm, sgn, sum_, sun, sym, syn, ALPHA, LIMIT, SHIFT,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr, INDEX_64: tl.constexpr,
               CLAMPED: tl.constexpr):
    rm, rn, mask = _element_tile(tile, M, N, BLOCK_M, BLOCK_N, INDEX_64)
    g = tl.load(g_ptr + rm[:, None] * sgm + rn[None, :] * sgn, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + rm[:, None] * sum_ + rn[None, :] * sun, mask=mask, other=0.0).to(tl.float32)
    if CLAMPED:
        c, v = _clamped(g, u, LIMIT)
        y = c / (1.0 + tl.exp(-ALPHA * c)) * (v + SHIFT)
    else:
        y = _activation(g, 0.0, ACT) * u
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gate_grad_kernel(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, M, N, n_tiles, nprog, sdm, sdn, sgm, sgn, sum_, sun,
                     sam, san, sbm, sbn, ALPHA, LIMIT, SHIFT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     ACT: tl.constexpr, PERSISTENT: tl.constexpr, INDEX_64: tl.constexpr, CLAMPED: tl.constexpr):
    """dG = dY * U * act'(G) and dU = dY * act(G) (or the clamped GLU's) over (BLOCK_M, BLOCK_N)
    tiles of the (M, N) operands (any strides), dY, G and U read once each (fp32 math)."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    if PERSISTENT:
        for tile in range(pid, n_tiles, nprog):
            _gate_grad_tile(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, tile, M, N, sdm, sdn, sgm, sgn, sum_, sun, sam, san,
                            sbm, sbn, ALPHA, LIMIT, SHIFT, BLOCK_M, BLOCK_N, ACT, INDEX_64, CLAMPED)
    else:
        _gate_grad_tile(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, pid, M, N, sdm, sdn, sgm, sgn, sum_, sun, sam, san,
                        sbm, sbn, ALPHA, LIMIT, SHIFT, BLOCK_M, BLOCK_N, ACT, INDEX_64, CLAMPED)


@triton.jit
def _gate_grad_tile(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, tile, M, N, sdm, sdn, sgm, sgn, sum_, sun, sam, san, sbm,
                    sbn, ALPHA, LIMIT, SHIFT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr,
                    INDEX_64: tl.constexpr, CLAMPED: tl.constexpr):
    rm, rn, mask = _element_tile(tile, M, N, BLOCK_M, BLOCK_N, INDEX_64)
    dy = tl.load(dy_ptr + rm[:, None] * sdm + rn[None, :] * sdn, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + rm[:, None] * sgm + rn[None, :] * sgn, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + rm[:, None] * sum_ + rn[None, :] * sun, mask=mask, other=0.0).to(tl.float32)
    if CLAMPED:  # y = (v + SHIFT) * c * s, s = sigmoid(ALPHA c); a clamp passes the gradient inside its bounds only
        c, v = _clamped(g, u, LIMIT)
        s = 1.0 / (1.0 + tl.exp(-ALPHA * c))
        dg = tl.where(g <= LIMIT, dy * (v + SHIFT) * (s + ALPHA * c * s * (1.0 - s)), 0.0)
        du = tl.where((u >= -LIMIT) & (u <= LIMIT), dy * c * s, 0.0)
    else:
        dg = dy * u * _activation_grad(g, 0.0, ACT)
        du = dy * _activation(g, 0.0, ACT)
    tl.store(dg_ptr + rm[:, None] * sam + rn[None, :] * san, dg.to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + rm[:, None] * sbm + rn[None, :] * sbn, du.to(du_ptr.dtype.element_ty), mask=mask)
