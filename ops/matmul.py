"""``matmul(a, b, *, out=None)`` with ``torch.matmul`` semantics, and ``linear(x, weight, bias=None,
activation=None)`` = ``F.linear`` followed by the activation, fused into the matmul epilogue.

Both run ``matmul_kernels.matmul_kernel``. Layout handling on the host:

* 1-D operands are promoted (``(K,)`` → ``(1, K)`` / ``(K, 1)``) and the extra dim dropped after;
* batch dims broadcast; a 2-D ``b`` under a batched contiguous ``a`` folds the batch into M;
* up to two batch dims run as they are (stride 0 where broadcast); more are collapsed or, when
  they cannot be, made contiguous first;
* float32 follows torch's TF32 setting for the device (``torch.backends.cuda.matmul.allow_tf32``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.launch import Launcher
from xkernels.ops import checks
from xkernels.ops.layout import INT32_MAX, collapse, contiguous_strides, max_offset, next_pow2, prod
from xkernels.ops.op import Op, Plan

ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "silu": 3, "leaky_relu": 4}
MATMUL_DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}


@dataclass
class MatmulCall:
    a: torch.Tensor  # (..., M, K) after 1-D promotion
    b: torch.Tensor  # (..., K, N)
    bias: torch.Tensor | None
    activation: str | None
    slope: float
    out: torch.Tensor | None
    batch: torch.Size
    out_shape: torch.Size  # the user-visible result shape
    dtype: torch.dtype
    device: torch.device
    kernel_ok: bool
    fallback_reason: str = ""


def _check_pair(op: str, a: Any, b: Any, names: tuple[str, str]) -> None:
    checks.require_tensor(op, names[0], a)
    checks.require_tensor(op, names[1], b)
    for n, t in zip(names, (a, b)):
        if t.dim() == 0:
            raise ValueError(f"xkernels.ops.{op}: '{n}' must have at least 1 dimension, got a 0-d tensor")
    if a.dtype != b.dtype:
        raise TypeError(f"xkernels.ops.{op}: '{names[0]}' and '{names[1]}' must have one dtype, "
                        f"got {a.dtype} and {b.dtype}")
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        raise TypeError(f"xkernels.ops.{op}: dtype {a.dtype} is not supported; use a floating-point dtype")


def _kernel_reason(dtype: torch.dtype) -> str:
    if dtype in checks.MATMUL_KERNEL_DTYPES:
        return ""
    return f"dtype {dtype} has no Triton matmul kernel; PyTorch computes it"


def _precision(backend: Backend, dtype: torch.dtype) -> str:
    if dtype != torch.float32:
        return "ieee"
    return backend.fp32_matmul_precision()


class MatmulPlan(Plan):
    def __init__(self, op: str, backend: Backend, call: MatmulCall, c_strides: tuple[int, ...]) -> None:
        from xkernels.ops import matmul_kernels as K

        a, b = call.a, call.b
        M, Kd, N = a.shape[-2], a.shape[-1], b.shape[-1]
        batch = tuple(call.batch)
        a_st = a.expand(*batch, M, Kd).stride()[: len(batch)] if batch else ()
        b_st = b.expand(*batch, Kd, N).stride()[: len(batch)] if batch else ()
        c_st = c_strides[: len(batch)]
        sizes, (sa, sb, sc) = collapse(batch, [a_st, b_st, c_st]) if batch else ([1], [[0], [0], [0]])
        self.materialize = len(sizes) > 2
        if self.materialize:
            sizes = [prod(batch)]
            sa, sb, sc = [M * Kd], [Kd * N], [M * N]
        sizes = [1] * (2 - len(sizes)) + sizes
        sa, sb, sc = ([0] * (2 - len(s)) + list(s) for s in (sa, sb, sc))
        n_batch = prod(sizes)
        dtype_name = str(call.dtype).removeprefix("torch.")
        key = {"dtype": dtype_name, "m": M, "n": N, "k": Kd, "batch": n_batch,
               "activation": call.activation or "none", "bias": call.bias is not None}
        choice = tuning.lookup(op, backend, backend.arch(call.device), key, MATMUL_DEFAULT)
        cfg = dict(choice.config)
        bm = max(16, min(int(cfg["BLOCK_M"]), next_pow2(M)))
        bn = max(16, min(int(cfg["BLOCK_N"]), next_pow2(N)))
        bk = max(16, min(int(cfg["BLOCK_K"]), next_pow2(max(Kd, 1))))
        tiles_m, tiles_n = (M + bm - 1) // bm, (N + bn - 1) // bn
        tiles = n_batch * tiles_m * tiles_n
        # split-K: one 2-D product, every (tile, split) program launched at once, K long enough
        split = int(cfg.get("SPLIT_K") or 1)
        if split > 1 and not (n_batch == 1 and not self.materialize and Kd >= 2 * bk
                              and backend.programs(tiles * split, "cube", call.device) == tiles * split):
            split = 1
        self.split_k = split
        programs = tiles * split if split > 1 else backend.programs(tiles, "cube", call.device)
        # 2-D operands whose leading stride breaks the backend's matrix-unit alignment are copied
        # into an aligned buffer first (Triton cannot vectorise rows that start misaligned)
        single = n_batch == 1 and not self.materialize and not batch
        self.align_a = _realign_to(a, backend) if single else None
        self.align_b = _realign_to(b, backend) if single else None
        a_st = _aligned_strides(a, self.align_a)
        b_st = _aligned_strides(b, self.align_b)
        a_full = [sa[0], sa[1], *a_st]
        b_full = [sb[0], sb[1], *b_st]
        c_full = [sc[0], sc[1], *c_strides[-2:]]
        self.c_mn_strides = tuple(c_full[2:])
        if split > 1:  # the main kernel writes the contiguous fp32 workspace; the reduction writes C
            c_full = [0, 0, N, 1]
        spans = [max_offset([*sizes, M, Kd], a_full), max_offset([*sizes, Kd, N], b_full),
                 max_offset([*sizes, M, N], c_full) + (split - 1) * M * N]
        index64 = max(spans) + 2**16 > INT32_MAX
        self.jit_fn = K.matmul_kernel
        self.grid = (programs,)
        self.dims = (M, N, Kd, sizes[1], tiles_m, tiles_n, tiles, programs)
        self.strides = (*a_full, *b_full, *c_full)
        self.constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=int(cfg["GROUP_M"]),
                               PRECISION=_precision(backend, call.dtype),
                               HAS_BIAS=call.bias is not None and split == 1,
                               ACT=ACTIVATIONS[call.activation] if split == 1 else 0, EVEN_K=Kd % bk == 0,
                               PERSISTENT=programs < tiles, INDEX_64=index64,
                               UPCAST=call.dtype == torch.bfloat16 and not backend.native_bf16_dot,
                               **_divisibility_hints(M, N, Kd, a_st, b_st, c_full[2:]), SPLIT_K=split)
        self.options = {k: cfg[k] for k in backend.launch_options if cfg.get(k) is not None}
        self.variant = "matmul" + (" + bias" if call.bias is not None else "") + (
            f" + {call.activation}" if call.activation else "")
        self.config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg["GROUP_M"],
                       "PRECISION": self.constexprs["PRECISION"], **self.options, "INDEX_64": index64}
        hints = {k: v for k, v in self.constexprs.items() if k.startswith("DIV_") and v > 1}
        if hints:
            self.config["divisibility hints"] = hints
        for name, q in (("realign_a", self.align_a), ("realign_b", self.align_b)):
            if q:
                self.config[name] = f"copy to a {q}-element leading stride"
        self.reduce_launcher: Launcher | None = None
        if split > 1:
            self._plan_reduction(backend, call, M, N)
        self.source = choice.source
        self.programs, self.tiles = programs, tiles
        self.backend = backend
        self.tma: dict[str, Any] | None = None
        if single and not self.align_a and not self.align_b and split == 1:
            self._try_tma(op, backend, call, key, M, N, Kd, a_st, b_st)
        self.launcher = Launcher(backend.kernel(self.jit_fn), self.grid, self.constexprs, self.options,
                                 backend.fast_launch, varying=(0, 1, 2, 3))  # a, b, c, bias pointers

    def _plan_reduction(self, backend: Backend, call: MatmulCall, M: int, N: int) -> None:
        """The second launch of a split-K plan: ``splitk_reduce_kernel`` over (16, 128) tiles."""
        from xkernels.ops import matmul_kernels as K

        rbm, rbn = min(16, next_pow2(M)), min(128, next_pow2(N))
        r_tiles = ((M + rbm - 1) // rbm) * ((N + rbn - 1) // rbn)
        constexprs = dict(SPLIT_K=self.split_k, BLOCK_M=rbm, BLOCK_N=rbn, HAS_BIAS=call.bias is not None,
                          ACT=ACTIVATIONS[call.activation])
        options = {"num_warps": 4} if "num_warps" in backend.launch_options else {}
        self.reduce_launcher = Launcher(backend.kernel(K.splitk_reduce_kernel), (r_tiles,), constexprs, options,
                                        backend.fast_launch, varying=(0, 1, 2))  # workspace, c, bias pointers
        self.config["SPLIT_K"] = self.split_k
        self.variant += f", K split {self.split_k} ways (fp32 partials, then a reduction kernel)"

    def workspace(self, device: torch.device) -> torch.Tensor:
        """The fp32 (SPLIT_K, M, N) partials of a split-K plan."""
        M, N = self.dims[0], self.dims[1]
        return torch.empty((self.split_k, M, N), dtype=torch.float32, device=device)

    def reduce_args(self, ws: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                    slope: float) -> tuple[Any, ...]:
        """The reduction kernel's runtime arguments (C as the plan's 2-D (M, N) strides)."""
        M, N = self.dims[0], self.dims[1]
        s_bias = bias.stride(0) if bias is not None else 0
        return (ws, c, bias if bias is not None else ws, M, N, *self.c_mn_strides, s_bias, float(slope))

    def _try_tma(self, op: str, backend: Backend, call: MatmulCall, key: dict[str, Any], M: int, N: int,
                 Kd: int, a_st: tuple[int, int], b_st: tuple[int, int]) -> None:
        """Switch to ``matmul_tma_kernel`` where the backend has tensor descriptors, the operands
        suit them (row-major A; B row-major or K-contiguous; 16-byte rows; unit-stride bias) and
        the table has a rule with ``"TMA": true`` for this bucket. The rule may add
        ``"PERSISTENT": true`` (one program per SM, from ``backend.compute_units``) and
        ``"EPILOGUE_SUBTILE": true`` (C stored in two halves of BLOCK_N // 2 columns)."""
        from xkernels.ops import matmul_kernels as K

        es = call.a.element_size()
        if call.dtype not in (torch.float16, torch.bfloat16) or not backend.tensor_descriptors(call.device):
            return
        if a_st[1] != 1 or (a_st[0] * es) % 16 or (N * es) % 16:
            return
        if call.bias is not None and call.bias.stride(0) != 1 and N > 1:
            return
        if b_st[1] == 1 and (b_st[0] * es) % 16 == 0:
            b_kmajor = False
        elif b_st[0] == 1 and (b_st[1] * es) % 16 == 0:
            b_kmajor = True
        else:
            return
        choice = tuning.lookup(op, backend, backend.arch(call.device), {**key, "variant": "tma"}, {})
        cfg = choice.config
        if not cfg.get("TMA"):
            return
        bm, bn, bk = (int(cfg[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        tiles = ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
        # persistent: one program per SM (compute unit), each walking tiles pid, pid + nprog, ...
        units = backend.compute_units(call.device) if cfg.get("PERSISTENT") else None
        programs = max(1, min(tiles, units)) if units else tiles
        subtile = bool(cfg.get("EPILOGUE_SUBTILE"))
        c_block = [bm, bn // 2] if subtile else [bm, bn]
        self.tma = {"a": [bm, bk], "b": [bn, bk] if b_kmajor else [bk, bn], "c": c_block, "b_kmajor": b_kmajor}
        self.jit_fn = K.matmul_tma_kernel
        self.grid = (programs,)
        self.dims = (M, N, Kd)
        self.constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=int(cfg.get("GROUP_M", 8)),
                               HAS_BIAS=call.bias is not None, ACT=ACTIVATIONS[call.activation], B_KMAJOR=b_kmajor,
                               PERSISTENT=bool(units), EPILOGUE_SUBTILE=subtile)
        self.options = {k: cfg[k] for k in backend.launch_options if cfg.get(k) is not None}
        self.variant += ", tiles loaded through tensor descriptors (TMA)"
        self.config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": self.constexprs["GROUP_M"],
                       **self.options, "TMA": True}
        if units:
            self.variant += ", persistent (a program per SM)"
            self.config["PERSISTENT"] = True
        if subtile:
            self.variant += ", C stored in two column halves"
            self.config["EPILOGUE_SUBTILE"] = True
        self.source = choice.source
        self.programs, self.tiles = programs, tiles

    def launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
               slope: float, batch: tuple[int, ...]) -> None:
        if self.materialize:
            M, Kd, N = a.shape[-2], a.shape[-1], b.shape[-1]
            a = a.expand(*batch, M, Kd).contiguous()
            b = b.expand(*batch, Kd, N).contiguous()
        if self.align_a:
            a = _aligned_copy(a, self.align_a)
        if self.align_b:
            b = _aligned_copy(b, self.align_b)
        if self.tma is not None and (a.data_ptr() | b.data_ptr()) & 15:  # TMA needs 16-byte bases
            a = a.clone() if a.data_ptr() & 15 else a  # a fresh allocation, same strides
            b = b.clone() if b.data_ptr() & 15 else b
        if self.reduce_launcher is not None:
            ws = self.workspace(c.device)
            self.launcher(*self.args(a, b, ws, None, slope))
            self.reduce_launcher(*self.reduce_args(ws, c, bias, slope))
            return
        self.launcher(*self.args(a, b, c, bias, slope))

    def args(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
             slope: float) -> tuple[Any, ...]:
        """The kernel's runtime arguments, in order (constexprs are ``self.constexprs``)."""
        bias_arg = bias if bias is not None else c
        if self.tma is not None:
            return (*self.descriptors(a, b, c), bias_arg, *self.dims, float(slope))
        s_bias = bias.stride(0) if bias is not None else 0
        return (a, b, c, bias_arg, *self.dims, *self.strides, s_bias, float(slope))


    def descriptors(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[Any, Any, Any]:
        """Tensor descriptors of the 2-D operands (B as the (N, K) weight when ``b_kmajor``)."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        t = self.tma
        assert t is not None
        bt = b.t() if t["b_kmajor"] else b
        c2 = c.view(a.shape[0], b.shape[1])
        return (TensorDescriptor(a, list(a.shape), [a.stride(0), 1], t["a"]),
                TensorDescriptor(bt, list(bt.shape), [bt.stride(0), 1], t["b"]),
                TensorDescriptor(c2, list(c2.shape), [c2.stride(0), 1], t["c"]))


def _hot_split(plan: MatmulPlan, call: MatmulCall) -> Any:
    """The hot entry of a split-K plan: allocate C and the workspace, launch both kernels."""
    assert plan.reduce_launcher is not None
    out_shape, dtype, device, backend = call.out_shape, call.dtype, call.device, plan.backend
    ws, c = plan.workspace(device), torch.empty(out_shape, dtype=dtype, device=device)
    main = plan.launcher.hot(plan.args(call.a, call.b, ws, None, call.slope), 4)
    reduce = plan.reduce_launcher.hot(plan.reduce_args(ws, c, call.bias, call.slope), 3)
    has_bias, precision, slope = call.bias is not None, plan.constexprs["PRECISION"], call.slope
    follows_setting = dtype == torch.float32

    def hot(a: torch.Tensor, b: torch.Tensor, bias: Any = None, activation: Any = None) -> torch.Tensor | None:
        if follows_setting and _precision(backend, dtype) != precision:
            return None  # torch's TF32 setting changed since this was planned
        ws, c = plan.workspace(device), torch.empty(out_shape, dtype=dtype, device=device)
        if not main(a, b, ws, ws):
            return None
        if not reduce(ws, c, bias if has_bias else ws):  # the partials are written: finish ordinarily
            assert plan.reduce_launcher is not None
            plan.reduce_launcher(*plan.reduce_args(ws, c, bias if has_bias else None, slope))
        return c

    return hot


class _HostDescriptor(NamedTuple):
    """What Triton 3.6's launcher reads of a ``TensorDescriptor`` argument (base, shape, strides,
    padding), without its per-object validation (~10 us a descriptor on an H100 host): for hot
    entries, whose shapes and strides were validated by the first call's real descriptors."""

    base: torch.Tensor
    shape: list[int]
    strides: list[int]
    block_shape: list[int]
    padding: str = "zero"


def _hot_tma(plan: MatmulPlan, call: MatmulCall, b_arg: torch.Tensor) -> Any:
    """The hot entry of a TMA plan: build the three descriptors from the call's tensors (the
    shapes, strides and block shapes are the first call's) and launch through Triton's compiled
    launcher. Bases must stay 16-byte aligned and the bias's alignment class the same, or the
    full path runs (it copies misaligned bases)."""
    t = plan.tma
    assert t is not None
    (M, N, K), out_shape, dtype, device = plan.dims, call.out_shape, call.dtype, call.device
    has_bias, slope = call.bias is not None, call.slope
    # the launch's specs: descriptors have none (None stands in: this call's bases may be the
    # misaligned ones the full path copied), the bias pointer its alignment, M/N/K their classes
    spec_args = (None, None, None, call.bias if has_bias else torch.empty(16, dtype=dtype, device=device),
                 M, N, K, float(slope))
    launch = plan.launcher.hot_run(spec_args)
    if launch is None:
        return None
    # B's descriptor base: the (N, K) weight when K-contiguous, else (K, N); the call's b is
    # either (linear's weight, matmul's transposed view), fixed by the entry's strides
    b_flip = t["b_kmajor"] and tuple(b_arg.shape) == (K, N) and b_arg.stride() == call.b.stride()
    bias_aligned = call.bias.data_ptr() % 16 == 0 if has_bias else True
    a_st, b_base = call.a.stride(0), (call.b.t() if t["b_kmajor"] else call.b)
    b_shape, b_st = list(b_base.shape), [b_base.stride(0), 1]
    a_shape, c_shape = [M, K], [M, N]

    def hot(a: torch.Tensor, b: torch.Tensor, bias: Any = None, activation: Any = None) -> torch.Tensor | None:
        if (a.data_ptr() | b.data_ptr()) & 15 or (has_bias and (bias.data_ptr() % 16 == 0) != bias_aligned):
            return None
        c = torch.empty(out_shape, dtype=dtype, device=device)
        descs = (_HostDescriptor(a if a.dim() == 2 else a.view(M, K), a_shape, [a_st, 1], t["a"]),
                 _HostDescriptor(b.t() if b_flip else b, b_shape, b_st, t["b"]),
                 _HostDescriptor(c if c.dim() == 2 else c.view(M, N), c_shape, [N, 1], t["c"]))
        return c if launch(*descs, bias if has_bias else c, M, N, K, slope) else None

    return hot


REALIGN_MIN_ELEMENTS = 1 << 16  # below this a copy costs more than misaligned loads


def _divisor(v: int) -> int:
    """The power of two dividing ``v`` that Triton does not already see: it specializes int
    arguments on == 1 and on divisibility by 16 only. 1 for 0, 1, odd values and multiples of 16."""
    return 1 if v <= 1 or v % 16 == 0 else v & -v


def _divisibility_hints(M: int, N: int, K: int, a_st: tuple[int, int], b_st: tuple[int, int],
                       c_st: Any) -> dict[str, int]:
    """``DIV_*`` constexprs: the kernel rewrites each value as a multiple of its hint, so rows
    that start 16-byte aligned (K = 1000 in bf16, say) get vector loads and pipelined copies
    instead of one element per load (5x slower on an H100). Hints are given only where they
    matter, along contiguous dims and for leading strides, to keep compiled variants few."""
    sam, sak = a_st
    sbk, sbn = b_st
    scm, scn = c_st
    return dict(DIV_M=_divisor(M) if sam == 1 else 1,
                DIV_N=_divisor(N) if sbn == 1 or scn == 1 else 1,
                DIV_K=_divisor(K) if sak == 1 or sbk == 1 else 1,
                DIV_SAM=_divisor(sam) if sak == 1 else 1, DIV_SAK=_divisor(sak) if sam == 1 else 1,
                DIV_SBK=_divisor(sbk) if sbn == 1 else 1, DIV_SBN=_divisor(sbn) if sbk == 1 else 1,
                DIV_SCM=_divisor(scm) if scn == 1 else 1)


def _realign_to(t: torch.Tensor, backend: Backend) -> int | None:
    """Elements to round ``t``'s leading stride up to, or ``None`` when it is fine as it is.

    The quantum is the backend's matrix-unit alignment (``cube_alignment``: 512 B on Ascend) and
    at least 16 bytes, one vector load (the kernel's ``DIV_*`` hints make that visible to
    Triton when the stride is not a multiple of 16 elements)."""
    if t.dim() != 2 or t.numel() < REALIGN_MIN_ELEMENTS:
        return None
    q = max(16, backend.alignment_for("cube")) // t.element_size()
    r, c = t.stride()
    if c == 1 and t.shape[1] > 1:
        return q if r % q else None
    if r == 1 and t.shape[0] > 1:
        return q if c % q else None
    return None


def _round_up(n: int, q: int) -> int:
    return (n + q - 1) // q * q


def _aligned_strides(t: torch.Tensor, q: int | None) -> tuple[int, int]:
    """``t``'s strides after ``_aligned_copy(t, q)``."""
    if not q:
        return t.stride()[-2], t.stride()[-1]
    if t.stride(1) == 1:
        return _round_up(t.shape[1], q), 1
    return 1, _round_up(t.shape[0], q)


def _aligned_copy(t: torch.Tensor, q: int) -> torch.Tensor:
    """A copy of 2-D ``t`` in the same major order with its leading stride a multiple of ``q``."""
    rows, cols = t.shape
    if t.stride(1) == 1:
        buf = torch.empty((rows, _round_up(cols, q)), dtype=t.dtype, device=t.device)
        buf[:, :cols].copy_(t)
        return buf[:, :cols]
    buf = torch.empty((cols, _round_up(rows, q)), dtype=t.dtype, device=t.device)
    buf[:, :rows].copy_(t.t())
    return buf[:, :rows].t()


class _MatmulBase(Op):
    def torch_impl(self, call: MatmulCall) -> torch.Tensor:
        raise NotImplementedError

    def plan_key(self, call: MatmulCall, backend: Backend) -> Any:
        return (backend.name, call.device, call.dtype, tuple(call.a.shape), call.a.stride(),
                tuple(call.b.shape), call.b.stride(), None if call.bias is None else call.bias.stride(),
                call.activation, _precision(backend, call.dtype), tuple(call.batch),
                call.out is not None and call.out.is_contiguous())

    def make_plan(self, call: MatmulCall, backend: Backend) -> Plan:
        M, N = call.a.shape[-2], call.b.shape[-1]
        c_strides = contiguous_strides(tuple(call.batch) + (M, N))
        return MatmulPlan(self.name, backend, call, c_strides)

    def make_hot(self, plan: Plan, call: MatmulCall, args: tuple[Any, ...]) -> Any:
        """No ``out``, operands used in place (no copies or folds): allocate the result and launch.

        ``args`` are (a, b) for matmul and (x, weight[, bias[, activation]]) for linear; the
        kernel's a/b operands are views of the first two sharing their data pointers."""
        assert isinstance(plan, MatmulPlan)
        a, b = args[0], args[1]
        if (call.out is not None or plan.materialize or plan.align_a or plan.align_b
                or call.a.data_ptr() != a.data_ptr() or call.b.data_ptr() != b.data_ptr()
                or not all(isinstance(t, torch.Tensor) for t in (a, b)) or prod(call.out_shape) == 0
                or any(isinstance(v, torch.Tensor) for v in args[2:] if v is not call.bias)):
            return None
        if plan.tma is not None:
            return _hot_tma(plan, call, b)
        if plan.reduce_launcher is not None:
            return _hot_split(plan, call)
        out_shape, dtype, device, backend = call.out_shape, call.dtype, call.device, plan.backend
        c = torch.empty(out_shape, dtype=dtype, device=device)
        launch = plan.launcher.hot(plan.args(call.a, call.b, c, call.bias, call.slope), 4)
        has_bias, precision = call.bias is not None, plan.constexprs["PRECISION"]
        follows_setting = dtype == torch.float32

        def hot(a: torch.Tensor, b: torch.Tensor, bias: Any = None, activation: Any = None) -> torch.Tensor | None:
            if follows_setting and _precision(backend, dtype) != precision:
                return None  # torch's TF32 setting changed since this was planned
            c = torch.empty(out_shape, dtype=dtype, device=device)
            return c if launch(a, b, c, bias if has_bias else c) else None

        return hot

    def run_plan(self, plan: Plan, call: MatmulCall) -> torch.Tensor:
        assert isinstance(plan, MatmulPlan)
        M, N = call.a.shape[-2], call.b.shape[-1]
        full = tuple(call.batch) + (M, N)
        direct = call.out is not None and call.out.is_contiguous()
        c = call.out.view(full) if direct else torch.empty(full, dtype=call.dtype, device=call.device)
        if c.numel():
            plan.launch(call.a, call.b, c, call.bias, call.slope, tuple(call.batch))
        result = c.view(call.out_shape)
        if call.out is None or direct:
            return call.out if direct else result
        call.out.copy_(result)
        return call.out


class Matmul(_MatmulBase):
    """``torch.matmul``: 1-D, 2-D and batched with broadcast batch dims; K = 0 gives zeros.

    float16, bfloat16 and float32 run the Triton kernel; float64 and complex are computed by
    PyTorch; integer and bool dtypes are a TypeError (as on CUDA in PyTorch).
    """

    name = "matmul"

    def check(self, a: Any, b: Any, *, out: torch.Tensor | None = None) -> MatmulCall:
        _check_pair("matmul", a, b, ("a", "b"))
        device = checks.common_device("matmul", {"a": a, "b": b})
        if a.device != b.device:
            raise ValueError(f"xkernels.ops.matmul: tensors must be on one device, got 'a' on {a.device}, "
                             f"'b' on {b.device}")
        a2 = a.unsqueeze(0) if a.dim() == 1 else a
        b2 = b.unsqueeze(-1) if b.dim() == 1 else b
        if a2.shape[-1] != b2.shape[-2]:
            raise ValueError(f"xkernels.ops.matmul: inner dimensions differ: 'a' {tuple(a.shape)} @ "
                             f"'b' {tuple(b.shape)} (K {a2.shape[-1]} vs {b2.shape[-2]})")
        batch = checks.broadcast_shape("matmul", {"a batch": a2.shape[:-2], "b batch": b2.shape[:-2]})
        M, N = a2.shape[-2], b2.shape[-1]
        # fold the batch of a into M when b has none and a's batch + M dims are one stride run
        if b.dim() <= 2 and a2.dim() > 2 and _foldable(a2):
            a2 = a2.reshape(-1, a2.shape[-1])
            batch = torch.Size()
        shape = list(checks.broadcast_shape("matmul", {"a batch": a.shape[:-2] if a.dim() > 1 else (),
                                                       "b batch": b.shape[:-2] if b.dim() > 1 else ()}))
        if a.dim() > 1:
            shape.append(M)
        if b.dim() > 1:
            shape.append(N)
        out_shape = torch.Size(shape)
        checks.check_out("matmul", out, out_shape, a.dtype, device, {"a": a, "b": b})
        reason = _kernel_reason(a.dtype)
        return MatmulCall(a2, b2, None, None, 0.0, out, batch, out_shape, a.dtype, device, not reason, reason)

    def torch_impl(self, call: MatmulCall) -> torch.Tensor:
        result = torch.matmul(call.a, call.b).reshape(call.out_shape)
        if call.out is None:
            return result
        call.out.copy_(result)
        return call.out


def _foldable(a: torch.Tensor) -> bool:
    """Whether a's batch dims and M form one stride run, so (B..., M, K) views as (B*M, K)."""
    sizes, strides = list(a.shape[:-1]), list(a.stride()[:-1])
    for i in range(len(sizes) - 1):
        if sizes[i] != 1 and strides[i] != strides[i + 1] * sizes[i + 1]:
            return False
    return True


class Linear(_MatmulBase):
    """``F.linear(x, weight, bias)`` followed by ``activation`` (relu, gelu, silu, leaky_relu),
    with bias and activation fused into the matmul epilogue. ``negative_slope`` is leaky_relu's."""

    name = "linear"

    def check(self, x: Any, weight: Any, bias: Any = None, activation: str | None = None, *,
              negative_slope: float = 0.01, out: torch.Tensor | None = None) -> MatmulCall:
        _check_pair("linear", x, weight, ("x", "weight"))
        if weight.dim() != 2:
            raise ValueError(f"xkernels.ops.linear: 'weight' must be 2-D (out_features, in_features), "
                             f"got shape {tuple(weight.shape)}")
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(f"xkernels.ops.linear: 'x' {tuple(x.shape)} has {x.shape[-1]} features, "
                             f"'weight' {tuple(weight.shape)} expects {weight.shape[1]}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"xkernels.ops.linear: 'activation' must be one of "
                             f"{[k for k in ACTIVATIONS if k]} or None, got {activation!r}")
        named = {"x": x, "weight": weight}
        if bias is not None:
            checks.require_tensor("linear", "bias", bias)
            if tuple(bias.shape) != (weight.shape[0],):
                raise ValueError(f"xkernels.ops.linear: 'bias' must have shape ({weight.shape[0]},), "
                                 f"got {tuple(bias.shape)}")
            if bias.dtype != x.dtype:
                raise TypeError(f"xkernels.ops.linear: 'bias' dtype {bias.dtype} differs from 'x' dtype {x.dtype}")
            named["bias"] = bias
        device = checks.common_device("linear", named)
        if any(t.device != device for t in named.values()):
            listing = ", ".join(f"'{n}' on {t.device}" for n, t in named.items())
            raise ValueError(f"xkernels.ops.linear: tensors must be on one device, got {listing}")
        out_shape = torch.Size((*x.shape[:-1], weight.shape[0]))
        checks.check_out("linear", out, out_shape, x.dtype, device, named)
        a = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        reason = _kernel_reason(x.dtype)
        return MatmulCall(a, weight.t(), bias, activation, float(negative_slope), out, torch.Size(),
                          out_shape, x.dtype, device, not reason, reason)

    def torch_impl(self, call: MatmulCall) -> torch.Tensor:
        result = reference_linear(call.a, call.b.t(), call.bias, call.activation, call.slope).reshape(call.out_shape)
        if call.out is None:
            return result
        call.out.copy_(result)
        return call.out


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     activation: str | None, negative_slope: float = 0.01) -> torch.Tensor:
    """The unfused PyTorch composition ``linear`` is defined by (and benchmarked against)."""
    y = torch.nn.functional.linear(x, weight, bias)
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu":
        return torch.nn.functional.gelu(y)
    if activation == "silu":
        return torch.nn.functional.silu(y)
    if activation == "leaky_relu":
        return torch.nn.functional.leaky_relu(y, negative_slope)
    return y


matmul = Matmul()
linear = Linear()
