"""Triton source of the matmul kernel behind ``matmul`` and ``linear``.

One source for every backend: C[b] = act(A[b] @ B[b] + bias), fp32 (int32) accumulation, any
strides, two broadcastable batch dims, grouped tile order for L2 reuse. Backend differences come
as launch arguments: ``PERSISTENT`` (Ascend launches one program per AI core and each walks
tiles ``pid, pid + nprog, ...``), the block sizes from the op's tuning table, ``PRECISION``
("tf32" or "ieee" for fp32 operands, following torch's setting for the device), and
``UPCAST`` where a backend cannot feed bfloat16 to ``tl.dot`` (the interpreter).

``matmul_tma_kernel`` is the sm90+ form of the same operation for 2-D fp16/bf16 operands whose
rows are 16-byte aligned: tiles are loaded through tensor descriptors (TMA). On an H100 it
measured 1.03-1.05x torch at 4096^3 against 0.91-0.99x for the pointer kernel, and it removes the
30% the pointer kernel loses on linear's K-contiguous weight (H100, 2026-11-22).
Its table config may make it persistent (programs walking tiles in one flattened loop, the next
tile's loads overlapping this tile's epilogue; ``PROGRAMS_PER_SM`` of them per SM, a host-side
grid choice) and store C in two column halves (``PERSISTENT``, ``EPILOGUE_SUBTILE``). With
128x128x64 tiles, 3 stages and C in halves, a program's shared memory (112 KiB for sm90) lets two
reside on an SM, so one's epilogue runs while the other's wgmma run: BERT's FFN up-projection with gelu
(8192 x 768 -> 3072, bf16) took 90.6 us against 99.3 us for one program per tile, 1.135x torch's
F.linear + F.gelu (H100, 2026-11-24, ``tools/probes/ffn_fast_gemm.py``).

Few rows (M <= 64) can split K (``SPLIT_K``): more programs stream B at once, and a second
kernel, ``splitk_reduce_kernel``, adds the fp32 partials in a fixed order (deterministic).

A residual (``linear(..., residual=r)``) is added after the activation by the ``*_residual_kernel``
entry points (same bodies, ``RES`` > 0, see ``ops/matmul/residual.py``): loaded in its own dtype,
added in fp32, one rounding to C's dtype. The entry points without a residual are unchanged
(their dummy residual arguments are constants and ``RES=0`` removes the code).

Activations (``ACT``): 0 none, 1 relu, 2 gelu (erf form, as F.gelu), 3 silu, 4 leaky_relu,
5 gelu_tanh (``F.gelu(approximate="tanh")``, GPT-2's), 6 the same erf GELU with erf by
Abramowitz & Stegun 7.1.26 (below), 7 ACT 6 as NVIDIA GPUs run it best (below), 8 quick_gelu
(``x * sigmoid(1.702 x)``, CLIP's ``QuickGELUActivation``), 9 relu2 (``relu(x) ** 2``, the squared
ReLU of Nemotron, Persimmon and Arcee). Every
epilogue (pointer, TMA, split-K reduction) applies them through ``_activation``.

The fast erf (``ACT`` 6): ``erfc(z) ~= t * poly5(t) * exp(-z^2)``, ``t = 1 / (1 + 0.3275911 z)``,
one exp and one approximate reciprocal instead of libdevice's ``erff``; its absolute error is at
most 1.5e-7, and GELU is formed from ``0.5 erfc(|x| / sqrt 2)`` directly (no cancellation for
negative x). Against a float64 reference over x in [-12, 12] the fp32 GELU's absolute error is
4.2e-7 (libdevice's form: 4.4e-7), but its relative error is 4x libdevice's (5.6e-7 against
1.3e-7 for x in [0, 3]): measurable in an fp32 result, below the rounding of an fp16/bf16 one
(rounded, it is the reference's rounding or one unit off for |GELU| > 1e-8; libdevice's
``1 + erf`` form cancels in the negative tail and is off by more from x ~ -4.5). Plans therefore
use it only where C is fp16/bf16 (``plan.gelu_code``), today the TMA plan's; the pointer kernel,
the split-K reduction and the gated kernels keep libdevice's erf. On an H100
it took BERT's FFN up-projection (8192 x 768 -> 3072, bf16) from 98.0 to 97.4 us with one tile
per program and is part of the persistent two-programs-per-SM config measured at 90.6 us
(``tools/probes/ffn_fast_gemm.py``, 2026-11-24).

``ACT`` 7 is the same formula with 1/sqrt(2) and 1/2 folded into its constants and the
reciprocal and exponential taken from the SFU in one instruction each (PTX ``rcp.approx.ftz`` /
``ex2.approx.ftz``, relative errors about 1 and 2 units of fp32's last place, denormals flushed:
they occur only where the term they feed is below fp32's range of interest). About a third fewer
instructions per element: in the persistent two-programs-per-SM kernel BERT's FFN up-projection
took 78.3 us against 91.1 us for ``ACT`` 6 (1.31x torch's F.linear + F.gelu; 8192 x 768 -> 3072,
bf16, H100, 2026-11-27, results/2026-11-27-h100-lean-gelu-epilogue). Inline PTX compiles only
for NVIDIA, so plans choose it where the backend says kernels may carry it
(``Backend.inline_ptx``), ``ACT`` 6 elsewhere (the interpreter, Ascend).
"""

import triton
import triton.language as tl


@triton.jit
def _rcp(x, PTX: tl.constexpr):
    """Approximately 1 / x: ``PTX``, the SFU's reciprocal with denormals flushed (``rcp.approx.ftz.f32``,
    NVIDIA only); else Triton's approximate division."""
    if PTX:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.fdiv(tl.full(x.shape, 1.0, tl.float32), x, ieee_rounding=False)


@triton.jit
def _exp2(x, PTX: tl.constexpr):
    """2 ** x: ``PTX``, the SFU's with denormals flushed (``ex2.approx.ftz.f32``, NVIDIA only);
    else Triton's."""
    if PTX:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def _activation(x, slope, ACT: tl.constexpr):
    if ACT == 1:
        x = tl.where(x > 0, x, 0.0)
    elif ACT == 2:
        x = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACT == 3:
        x = x / (1.0 + tl.exp(-x))
    elif ACT == 4:
        x = tl.where(x >= 0, x, x * slope)
    elif ACT == 5:  # 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x / (1.0 + tl.exp(-2.0 * u))
    elif ACT == 6 or ACT == 7:  # gelu, erf by Abramowitz & Stegun 7.1.26 (the module doc); 7: SFU rcp / ex2 by PTX
        # 0.5 erfc(|x| / sqrt 2) = t poly5(t) exp(-x^2 / 2), t = 1 / (1 + 0.3275911 |x| / sqrt 2), the 1 / sqrt 2
        # and the 0.5 folded into the constants, exp(-x^2 / 2) = 2^(x^2 (-1 / (2 ln 2)))
        t = _rcp(1.0 + 0.2316418882663604 * tl.abs(x), ACT == 7)
        p = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
        q = p * _exp2(x * x * -0.7213475204444817, ACT == 7)
        x = x * tl.where(x >= 0, 1.0 - q, q)  # no cancellation for negative x
    elif ACT == 8:  # quick_gelu: x sigmoid(1.702 x)
        x = x / (1.0 + tl.exp(-1.702 * x))
    elif ACT == 9:  # relu2: relu(x)^2
        x = tl.where(x > 0, x, 0.0)
        x = x * x
    return x


@triton.jit
def _add(a, b):
    """``tl.sum``'s combine function for ``tl.reduce`` (``tl.sum`` is a jitted library function the
    in-process interpreter cannot call)."""
    return a + b


@triton.jit
def _activation_grad(h, slope, ACT: tl.constexpr):
    """d act(h) / dh in fp32 for the ``ACT`` codes of ``_activation`` (training's backward: the
    pre-activation ``h`` read in a GEMM's epilogue, ``matmul_tma_act_grad_kernel``)."""
    if ACT == 1:
        d = tl.where(h > 0, 1.0, 0.0)
    elif ACT == 2:  # Phi(h) + h phi(h)
        d = 0.5 * (1.0 + tl.erf(h * 0.7071067811865476)) + h * tl.exp(-0.5 * h * h) * 0.3989422804014327
    elif ACT == 3:  # s (1 + h (1 - s)), s = sigmoid(h)
        s = 1.0 / (1.0 + tl.exp(-h))
        d = s * (1.0 + h * (1.0 - s))
    elif ACT == 4:  # slope at 0, as PyTorch's leaky_relu_backward
        d = tl.where(h > 0, 1.0, slope)
    elif ACT == 5:  # s + h s (1 - s) 2 du/dh, s = sigmoid(2u), u as in _activation
        u = 0.7978845608028654 * (h + 0.044715 * h * h * h)
        s = 1.0 / (1.0 + tl.exp(-2.0 * u))
        d = s + h * s * (1.0 - s) * (2.0 * 0.7978845608028654) * (1.0 + 3.0 * 0.044715 * h * h)
    elif ACT == 6 or ACT == 7:  # Phi(h) + h phi(h) with ACT 6's erfc; exp(-h^2 / 2) serves both terms
        t = _rcp(1.0 + 0.2316418882663604 * tl.abs(h), ACT == 7)
        p = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
        e = _exp2(h * h * -0.7213475204444817, ACT == 7)
        q = p * e
        d = tl.where(h >= 0, 1.0 - q, q) + h * e * 0.3989422804014327
    elif ACT == 8:  # s (1 + 1.702 h (1 - s)), s = sigmoid(1.702 h)
        s = 1.0 / (1.0 + tl.exp(-1.702 * h))
        d = s * (1.0 + 1.702 * h * (1.0 - s))
    elif ACT == 9:  # 2 relu(h)
        d = tl.where(h > 0, 2.0 * h, 0.0)
    else:
        d = tl.full(h.shape, 1.0, tl.float32)
    return d


@triton.jit
def _multiple(x, Q: tl.constexpr):
    """``x``, with the compiler told it is a multiple of ``Q`` (the host guarantees it)."""
    if Q > 1:
        x = (x // Q) * Q
    return x


@triton.jit
def _add_residual(acc, res_ptr, rm, rn, mask, R1, sr0, sr1, srn, RES: tl.constexpr, WIDE: tl.constexpr):
    """``acc`` plus the residual tile of rows ``rm`` and columns ``rn``, read in its dtype and added
    in fp32. ``RES`` 1: row r at ``r * sr1``; 2: rows in groups of ``R1``, row r at
    ``(r // R1) * sr0 + (r % R1) * sr1`` (a residual broadcast over one leading dim)."""
    if WIDE:
        rm = rm.to(tl.int64)
    if RES == 2:
        offs = (rm // R1) * sr0 + (rm % R1) * sr1
    else:
        offs = rm * sr1
    r = tl.load(res_ptr + offs[:, None] + rn[None, :] * srn, mask=mask, other=0.0)
    return acc + r.to(tl.float32)


@triton.jit
def _mm_tile(a_ptr, b_ptr, c_ptr, bias_ptr, tile, split, M, N, K, B1, tiles_m, tiles_n,
             sa0, sa1, sam, sak, sb0, sb1, sbk, sbn, sc0, sc1, scm, scn, s_bias, slope,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
             PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr,
             INDEX_64: tl.constexpr, UPCAST: tl.constexpr, DIV_M: tl.constexpr, DIV_N: tl.constexpr,
             DIV_K: tl.constexpr, DIV_SAM: tl.constexpr, DIV_SAK: tl.constexpr, DIV_SBK: tl.constexpr,
             DIV_SBN: tl.constexpr, DIV_SCM: tl.constexpr, SPLIT_K: tl.constexpr,
             res_ptr, R1, sr0, sr1, srn, RES: tl.constexpr):
    M, N, K = _multiple(M, DIV_M), _multiple(N, DIV_N), _multiple(K, DIV_K)
    sam, sak, sbk, sbn = _multiple(sam, DIV_SAM), _multiple(sak, DIV_SAK), _multiple(sbk, DIV_SBK), _multiple(sbn, DIV_SBN)
    scm = _multiple(scm, DIV_SCM)
    per_batch = tiles_m * tiles_n
    bidx = tile // per_batch
    t = tile % per_batch
    width = GROUP_M * tiles_n
    first_m = (t // width) * GROUP_M
    rest = tiles_m - first_m
    group_size = tl.where(rest < GROUP_M, rest, GROUP_M)
    pid_m = first_m + (t % width) % group_size
    pid_n = (t % width) // group_size
    b0 = bidx // B1
    b1 = bidx % B1

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if INDEX_64:
        rk = rk.to(tl.int64)
    k_lo = 0
    k_hi = K
    if SPLIT_K > 1:  # this program's share of K: whole BLOCK_K steps, the last split may get none
        per_split = (((K + BLOCK_K - 1) // BLOCK_K + SPLIT_K - 1) // SPLIT_K) * BLOCK_K
        k_lo = split * per_split
        k_hi = tl.minimum(K, k_lo + per_split)
    a_ptrs = a_ptr + b0 * sa0 + b1 * sa1 + rm[:, None] * sam + (k_lo + rk)[None, :] * sak
    b_ptrs = b_ptr + b0 * sb0 + b1 * sb1 + (k_lo + rk)[:, None] * sbk + rn[None, :] * sbn
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = (k + rk) < K
            a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:  # the Triton interpreter's dot reads bfloat16 as raw uint16
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    if SPLIT_K > 1:  # an fp32 partial into the (SPLIT_K, M, N) workspace; the reduction adds the rest
        c_ptr += split * M * N
    else:
        if HAS_BIAS:
            bias = tl.load(bias_ptr + rn * s_bias, mask=n_ok, other=0.0)
            acc = acc + bias.to(tl.float32)[None, :]
        acc = _activation(acc, slope, ACT)
        if RES > 0:
            acc = _add_residual(acc, res_ptr, rm, rn, m_ok[:, None] & n_ok[None, :], R1, sr0, sr1, srn, RES, INDEX_64)
    c_ptrs = c_ptr + b0 * sc0 + b1 * sc1 + rm[:, None] * scm + rn[None, :] * scn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, B1, tiles_m, tiles_n, n_tiles, nprog,
                  sa0, sa1, sam, sak, sb0, sb1, sbk, sbn, sc0, sc1, scm, scn, s_bias, slope,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr,
                  PERSISTENT: tl.constexpr, INDEX_64: tl.constexpr, UPCAST: tl.constexpr,
                  DIV_M: tl.constexpr, DIV_N: tl.constexpr, DIV_K: tl.constexpr, DIV_SAM: tl.constexpr,
                  DIV_SAK: tl.constexpr, DIV_SBK: tl.constexpr, DIV_SBN: tl.constexpr, DIV_SCM: tl.constexpr,
                  SPLIT_K: tl.constexpr = 1):
    """C = act(A @ B + bias) over ``n_tiles`` output tiles (batch x tiles_m x tiles_n).

    ``SPLIT_K`` > 1 (one 2-D product, one program per tile and split): program ``pid`` sums its
    share of K for tile ``pid // SPLIT_K`` into ``c_ptr``, an fp32 (SPLIT_K, M, N) workspace;
    ``splitk_reduce_kernel`` adds the partials, the bias and the activation."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    if PERSISTENT:
        for tile in range(pid, n_tiles, nprog):
            _mm_tile(a_ptr, b_ptr, c_ptr, bias_ptr, tile, 0, M, N, K, B1, tiles_m, tiles_n,
                     sa0, sa1, sam, sak, sb0, sb1, sbk, sbn, sc0, sc1, scm, scn, s_bias, slope,
                     BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PRECISION, HAS_BIAS, ACT, EVEN_K, INDEX_64, UPCAST,
                     DIV_M, DIV_N, DIV_K, DIV_SAM, DIV_SAK, DIV_SBK, DIV_SBN, DIV_SCM, 1, c_ptr, 1, 0, 0, 0, 0)
    else:
        _mm_tile(a_ptr, b_ptr, c_ptr, bias_ptr, pid // SPLIT_K, pid % SPLIT_K, M, N, K, B1, tiles_m, tiles_n,
                 sa0, sa1, sam, sak, sb0, sb1, sbk, sbn, sc0, sc1, scm, scn, s_bias, slope,
                 BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PRECISION, HAS_BIAS, ACT, EVEN_K, INDEX_64, UPCAST,
                 DIV_M, DIV_N, DIV_K, DIV_SAM, DIV_SAK, DIV_SBK, DIV_SBN, DIV_SCM, SPLIT_K, c_ptr, 1, 0, 0, 0, 0)


@triton.jit
def matmul_residual_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, B1, tiles_m, tiles_n, n_tiles, nprog,
                           sa0, sa1, sam, sak, sb0, sb1, sbk, sbn, sc0, sc1, scm, scn, s_bias, slope,
                           res_ptr, R1, sr0, sr1, srn,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr, PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr,
                           ACT: tl.constexpr, EVEN_K: tl.constexpr, PERSISTENT: tl.constexpr,
                           INDEX_64: tl.constexpr, UPCAST: tl.constexpr, DIV_M: tl.constexpr, DIV_N: tl.constexpr,
                           DIV_K: tl.constexpr, DIV_SAM: tl.constexpr, DIV_SAK: tl.constexpr, DIV_SBK: tl.constexpr,
                           DIV_SBN: tl.constexpr, DIV_SCM: tl.constexpr, RES: tl.constexpr,
                           SPLIT_K: tl.constexpr = 1):
    """C = act(A @ B + bias) + residual (2-D A and B, no split: a split-K plan adds the residual
    in ``splitk_reduce_residual_kernel``); ``res_ptr`` and ``RES`` as ``_add_residual``'s."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    if PERSISTENT:
        for tile in range(pid, n_tiles, nprog):
            _mm_tile(a_ptr, b_ptr, c_ptr, bias_ptr, tile, 0, M, N, K, B1, tiles_m, tiles_n,
                     sa0, sa1, sam, sak, sb0, sb1, sbk, sbn, sc0, sc1, scm, scn, s_bias, slope,
                     BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PRECISION, HAS_BIAS, ACT, EVEN_K, INDEX_64, UPCAST,
                     DIV_M, DIV_N, DIV_K, DIV_SAM, DIV_SAK, DIV_SBK, DIV_SBN, DIV_SCM, 1, res_ptr, R1, sr0, sr1, srn,
                     RES)
    else:
        _mm_tile(a_ptr, b_ptr, c_ptr, bias_ptr, pid, 0, M, N, K, B1, tiles_m, tiles_n,
                 sa0, sa1, sam, sak, sb0, sb1, sbk, sbn, sc0, sc1, scm, scn, s_bias, slope,
                 BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PRECISION, HAS_BIAS, ACT, EVEN_K, INDEX_64, UPCAST,
                 DIV_M, DIV_N, DIV_K, DIV_SAM, DIV_SAK, DIV_SBK, DIV_SBN, DIV_SCM, 1, res_ptr, R1, sr0, sr1, srn, RES)


@triton.jit
def _splitk_reduce(ws_ptr, c_ptr, bias_ptr, M, N, scm, scn, s_bias, slope, res_ptr, R1, sr0, sr1, srn,
                   SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                   ACT: tl.constexpr, RES: tl.constexpr, RES_64: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    rm = (pid // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    offs = rm[:, None] * N + rn[None, :]
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + rn * s_bias, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    acc = _activation(acc, slope, ACT)
    if RES > 0:
        acc = _add_residual(acc, res_ptr, rm, rn, mask, R1, sr0, sr1, srn, RES, RES_64)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def splitk_reduce_kernel(ws_ptr, c_ptr, bias_ptr, M, N, scm, scn, s_bias, slope, SPLIT_K: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """C = act(sum of the SPLIT_K fp32 partials in ``ws_ptr`` (SPLIT_K, M, N) + bias), cast to C."""
    _splitk_reduce(ws_ptr, c_ptr, bias_ptr, M, N, scm, scn, s_bias, slope, ws_ptr, 1, 0, 0, 0, SPLIT_K, BLOCK_M,
                   BLOCK_N, HAS_BIAS, ACT, 0, False)


@triton.jit
def splitk_reduce_residual_kernel(ws_ptr, c_ptr, bias_ptr, M, N, scm, scn, s_bias, slope, res_ptr, R1, sr0, sr1,
                                  srn, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                  HAS_BIAS: tl.constexpr, ACT: tl.constexpr, RES: tl.constexpr,
                                  RES_64: tl.constexpr):
    """``splitk_reduce_kernel`` plus the residual (``_add_residual``)."""
    _splitk_reduce(ws_ptr, c_ptr, bias_ptr, M, N, scm, scn, s_bias, slope, res_ptr, R1, sr0, sr1, srn, SPLIT_K,
                   BLOCK_M, BLOCK_N, HAS_BIAS, ACT, RES, RES_64)


@triton.jit
def _tma_tile(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Row and column offsets of output tile ``tile`` in grouped order (L2 reuse)."""
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    width = GROUP_M * ((N + BLOCK_N - 1) // BLOCK_N)
    first_m = (tile // width) * GROUP_M
    group = tl.minimum(tiles_m - first_m, GROUP_M)
    return (first_m + (tile % width) % group) * BLOCK_M, ((tile % width) // group) * BLOCK_N


@triton.jit
def _tma_accumulate(a_desc, b_desc, off_m, off_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, A_MMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr,
                    WARP_SPECIALIZE: tl.constexpr = False):
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in tl.range(0, K, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
        if A_MMAJOR:  # A given as its (K, M) transpose: a weight gradient's grad.T
            a = a_desc.load([k, off_m]).T
        else:
            a = a_desc.load([off_m, k])
        if B_KMAJOR:
            acc = tl.dot(a, b_desc.load([off_n, k]).T, acc)
        else:
            acc = tl.dot(a, b_desc.load([k, off_n]), acc)
    return acc


@triton.jit
def _tma_store(c_desc, bias_ptr, acc, off_m, off_n, M, N, slope, res_ptr, R1, sr0, sr1, srn, h_desc,
               BLOCK_M: tl.constexpr, WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
               RES: tl.constexpr, RES_64: tl.constexpr, PRE: tl.constexpr, GRAD: tl.constexpr = 0,
               DBIAS: tl.constexpr = False):
    """act(acc + bias) (+ the residual) into the ``WIDTH`` columns of C from ``off_n``; ``PRE``:
    acc + bias, the pre-activation, into H's too. ``GRAD`` (an ``ACT`` code): acc times that
    activation's derivative at H's tile instead (H read through ``h_desc``); ``DBIAS``: the column
    sums of the rounded result into row ``off_m // BLOCK_M`` of the fp32 (tiles_m, N) buffer at
    ``bias_ptr`` (a bias gradient's partial sums, added in a fixed order by the caller)."""
    if GRAD > 0:
        acc = acc * _activation_grad(h_desc.load([off_m, off_n]).to(tl.float32), slope, GRAD)
        out = acc.to(c_desc.dtype)
        if DBIAS:
            rn = off_n + tl.arange(0, WIDTH)
            tl.store(bias_ptr + (off_m // BLOCK_M) * N + rn, tl.reduce(out.to(tl.float32), 0, _add), mask=rn < N)
        c_desc.store([off_m, off_n], out)
    else:
        if HAS_BIAS:
            rn = off_n + tl.arange(0, WIDTH)
            acc = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if PRE:
            h_desc.store([off_m, off_n], acc.to(h_desc.dtype))
        acc = _activation(acc, slope, ACT)
        if RES > 0:  # pointer loads: any residual strides (TMA would need a 16-byte-aligned row-major one)
            rm = off_m + tl.arange(0, BLOCK_M)
            rn = off_n + tl.arange(0, WIDTH)
            acc = _add_residual(acc, res_ptr, rm, rn, (rm < M)[:, None] & (rn < N)[None, :], R1, sr0, sr1, srn,
                                RES, RES_64)
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


@triton.jit
def _tma_epilogue(c_desc, bias_ptr, acc, off_m, off_n, M, N, slope, res_ptr, R1, sr0, sr1, srn, h_desc,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                  EPILOGUE_SUBTILE: tl.constexpr, RES: tl.constexpr, RES_64: tl.constexpr, PRE: tl.constexpr,
                  GRAD: tl.constexpr = 0, DBIAS: tl.constexpr = False):
    if EPILOGUE_SUBTILE:  # two (BLOCK_M, BLOCK_N // 2) halves: half the staging buffer in shared memory
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        acc0, acc1 = tl.split(halves)
        _tma_store(c_desc, bias_ptr, acc0, off_m, off_n, M, N, slope, res_ptr, R1, sr0, sr1, srn, h_desc, BLOCK_M,
                   BLOCK_N // 2, HAS_BIAS, ACT, RES, RES_64, PRE, GRAD, DBIAS)
        _tma_store(c_desc, bias_ptr, acc1, off_m, off_n + BLOCK_N // 2, M, N, slope, res_ptr, R1, sr0, sr1, srn,
                   h_desc, BLOCK_M, BLOCK_N // 2, HAS_BIAS, ACT, RES, RES_64, PRE, GRAD, DBIAS)
    else:
        _tma_store(c_desc, bias_ptr, acc, off_m, off_n, M, N, slope, res_ptr, R1, sr0, sr1, srn, h_desc, BLOCK_M,
                   BLOCK_N, HAS_BIAS, ACT, RES, RES_64, PRE, GRAD, DBIAS)


@triton.jit
def _tma_matmul(a_desc, b_desc, c_desc, bias_ptr, M, N, K, slope, res_ptr, R1, sr0, sr1, srn, h_desc,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                HAS_BIAS: tl.constexpr, ACT: tl.constexpr, B_KMAJOR: tl.constexpr, PERSISTENT: tl.constexpr,
                EPILOGUE_SUBTILE: tl.constexpr, A_MMAJOR: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                RES: tl.constexpr, RES_64: tl.constexpr, PRE: tl.constexpr, GRAD: tl.constexpr = 0,
                DBIAS: tl.constexpr = False):
    """The body of the ``matmul_tma_*kernel`` entry points (see the first)."""
    pid = tl.program_id(0)
    if PERSISTENT and WARP_SPECIALIZE:
        nprog = tl.num_programs(0)
        n_tiles = ((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
        for tile in tl.range(pid, n_tiles, nprog, warp_specialize=True):
            off_m, off_n = _tma_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = _tma_accumulate(a_desc, b_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, A_MMAJOR, B_KMAJOR)
            _tma_epilogue(c_desc, bias_ptr, acc, off_m, off_n, M, N, slope, res_ptr, R1, sr0, sr1, srn, h_desc,
                          BLOCK_M, BLOCK_N, HAS_BIAS, ACT, EPILOGUE_SUBTILE, RES, RES_64, PRE, GRAD, DBIAS)
    elif PERSISTENT:
        nprog = tl.num_programs(0)
        tile_c = pid - nprog
        n_tiles = ((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
        for tile in tl.range(pid, n_tiles, nprog, flatten=True):
            off_m, off_n = _tma_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = _tma_accumulate(a_desc, b_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, A_MMAJOR, B_KMAJOR)
            # the epilogue recounts its tile (as Triton's persistent-matmul tutorial does), so the
            # pipeliner need not carry the load offsets over to it
            tile_c += nprog
            off_cm, off_cn = _tma_tile(tile_c, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            _tma_epilogue(c_desc, bias_ptr, acc, off_cm, off_cn, M, N, slope, res_ptr, R1, sr0, sr1, srn, h_desc,
                          BLOCK_M, BLOCK_N, HAS_BIAS, ACT, EPILOGUE_SUBTILE, RES, RES_64, PRE, GRAD, DBIAS)
    else:
        off_m, off_n = _tma_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _tma_accumulate(a_desc, b_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, A_MMAJOR, B_KMAJOR,
                              WARP_SPECIALIZE)
        _tma_epilogue(c_desc, bias_ptr, acc, off_m, off_n, M, N, slope, res_ptr, R1, sr0, sr1, srn, h_desc, BLOCK_M,
                      BLOCK_N, HAS_BIAS, ACT, EPILOGUE_SUBTILE, RES, RES_64, PRE, GRAD, DBIAS)


@triton.jit
def matmul_tma_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K, slope,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, B_KMAJOR: tl.constexpr,
                      PERSISTENT: tl.constexpr = False, EPILOGUE_SUBTILE: tl.constexpr = False,
                      A_MMAJOR: tl.constexpr = False, WARP_SPECIALIZE: tl.constexpr = False):
    """C = act(A @ B + bias) for 2-D A given as (M, K) or, ``A_MMAJOR``, as its (K, M) transpose
    (a weight gradient's ``grad.T``), and B given as (K, N) or, ``B_KMAJOR``, as the (N, K)
    weight of ``linear``: tiles move through tensor descriptors (the TMA engine on sm90+), which
    zero-fill reads past the edges and clip writes, so no masks are needed.

    One program per output tile, grouped for L2 reuse; ``PERSISTENT``: the grid's programs (one per
    SM, or the config's ``PROGRAMS_PER_SM``: the plan's choice, not the kernel's) walk tiles
    ``pid, pid + nprog, ...`` in one flattened loop, so the next tile's loads overlap this tile's
    epilogue. ``EPILOGUE_SUBTILE``: C is written in two column halves (``c_desc``'s block is
    (BLOCK_M, BLOCK_N // 2)). ``ACT`` 6 (gelu with the fast erf, see the module doc) is what the
    plan passes for gelu when C is fp16/bf16. ``WARP_SPECIALIZE``: Triton's automatic warp specialization
    (TMA-load warps apart from MMA/epilogue warps; sm90 and sm100 passes) on the tile loop when
    persistent (then not flattened), on the K loop otherwise."""
    _tma_matmul(a_desc, b_desc, c_desc, bias_ptr, M, N, K, slope, bias_ptr, 1, 0, 0, 0, c_desc, BLOCK_M, BLOCK_N,
                BLOCK_K, GROUP_M, HAS_BIAS, ACT, B_KMAJOR, PERSISTENT, EPILOGUE_SUBTILE, A_MMAJOR, WARP_SPECIALIZE, 0,
                False, False)


@triton.jit
def matmul_tma_residual_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K, slope, res_ptr, R1, sr0, sr1, srn,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                               B_KMAJOR: tl.constexpr, PERSISTENT: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
                               A_MMAJOR: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, RES: tl.constexpr,
                               RES_64: tl.constexpr):
    """``matmul_tma_kernel`` plus the residual, loaded with pointer loads in the epilogue
    (``_add_residual``)."""
    _tma_matmul(a_desc, b_desc, c_desc, bias_ptr, M, N, K, slope, res_ptr, R1, sr0, sr1, srn, c_desc, BLOCK_M,
                BLOCK_N, BLOCK_K, GROUP_M, HAS_BIAS, ACT, B_KMAJOR, PERSISTENT, EPILOGUE_SUBTILE, A_MMAJOR,
                WARP_SPECIALIZE, RES, RES_64, False)


@triton.jit
def matmul_tma_pre_kernel(a_desc, b_desc, c_desc, h_desc, bias_ptr, M, N, K, slope,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, B_KMAJOR: tl.constexpr,
                          PERSISTENT: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, A_MMAJOR: tl.constexpr,
                          WARP_SPECIALIZE: tl.constexpr):
    """``matmul_tma_kernel`` that also stores the pre-activation A @ B + bias into H (``h_desc``,
    C's shape, dtype and block): training's forward, whose backward reads it
    (``ops/matmul/pre_activation.py``)."""
    _tma_matmul(a_desc, b_desc, c_desc, bias_ptr, M, N, K, slope, bias_ptr, 1, 0, 0, 0, h_desc, BLOCK_M, BLOCK_N,
                BLOCK_K, GROUP_M, HAS_BIAS, ACT, B_KMAJOR, PERSISTENT, EPILOGUE_SUBTILE, A_MMAJOR, WARP_SPECIALIZE, 0,
                False, True)


@triton.jit
def matmul_tma_act_grad_kernel(a_desc, b_desc, c_desc, h_desc, dbias_ptr, M, N, K, slope,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr, PERSISTENT: tl.constexpr,
                               EPILOGUE_SUBTILE: tl.constexpr, A_MMAJOR: tl.constexpr,
                               WARP_SPECIALIZE: tl.constexpr, GRAD: tl.constexpr, DBIAS: tl.constexpr):
    """C = (A @ B) * act'(H), act the ``GRAD`` code of ``_activation``, H read through ``h_desc``
    (C's shape, dtype and block): training's backward through ``down(act(up(x)))``, the gradient
    at the up-projection's pre-activation straight from the down-projection's input-gradient GEMM
    (A the output gradient, B the down-projection's (out, in) weight, read (K, N) row-major or,
    ``B_KMAJOR``, as its transpose), ``ops/matmul/feed_forward.py``. ``DBIAS``: each tile's column
    sums of C into row ``tile_m`` of the fp32 (tiles_m, N) buffer ``dbias_ptr``. H's tile is
    loaded through a staging buffer in shared memory, which the caller pays for with one pipeline
    stage fewer where two programs share an SM (``feed_forward.ActGradPlan``)."""
    _tma_matmul(a_desc, b_desc, c_desc, dbias_ptr, M, N, K, slope, dbias_ptr, 1, 0, 0, 0, h_desc, BLOCK_M, BLOCK_N,
                BLOCK_K, GROUP_M, False, 0, B_KMAJOR, PERSISTENT, EPILOGUE_SUBTILE, A_MMAJOR, WARP_SPECIALIZE, 0,
                False, False, GRAD, DBIAS)
