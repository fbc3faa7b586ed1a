"""How a matmul/linear call launches: grid, strides, constexprs and the kernel arguments.

``MatmulPlan`` turns one call signature plus its :class:`~xkernels.ops.matmul.config.Selection`
into launches of ``matmul_kernels.matmul_kernel`` (pointer loads), ``matmul_tma_kernel`` (tiles
through tensor descriptors, sm90+) or, for split-K, ``matmul_kernel`` writing fp32 partials
followed by ``splitk_reduce_kernel``; or, for a ``"VENDOR": true`` selection (a shape class where
the tuner measured the device's own BLAS faster than every kernel config), into the PyTorch call
itself. Host-side layout work lives here too: batch dims collapsed or materialised, 2-D operands
copied to an aligned leading stride where the backend's matrix unit needs it (or, on a backend
with ``misaligned_to_vendor``, the call given to its BLAS), and ``DIV_*`` divisibility hints so
16-byte-aligned odd shapes vectorise. A call with a residual (``linear(..., residual=r)``) runs
the ``*_residual_kernel`` entry points with its :class:`~xkernels.ops.matmul.residual.ResidualLayout`
(``ops/matmul/residual.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.launch import Launcher
from xkernels.ops.layout import INT32_MAX, collapse, max_offset, prod
from xkernels.ops.matmul import config as matmul_config
from xkernels.ops.matmul import evidence as matmul_evidence
from xkernels.ops.matmul import residual as matmul_residual
from xkernels.ops.matmul.vendor import BLAS_EPILOGUES
from xkernels.ops.op import Plan

if TYPE_CHECKING:
    from xkernels.ops.matmul.ops import MatmulCall

#: Epilogue activation codes of the kernels (``ACT`` constexpr).
ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "silu": 3, "leaky_relu": 4, "gelu_tanh": 5, "quick_gelu": 8, "relu2": 9}
#: ``ACT`` of gelu with erf by Abramowitz & Stegun 7.1.26 (``ops/matmul/kernels.py``'s module doc).
GELU_FAST_ERF = 6
#: ``ACT`` of the same GELU as NVIDIA GPUs run it best: folded constants, SFU rcp / ex2 by inline PTX.
GELU_FAST_ERF_PTX = 7


def gelu_code(activation: str | None, out_dtype: torch.dtype, ptx: bool = False) -> int:
    """``ACT`` for ``activation`` written to a C of ``out_dtype``: gelu takes the fast erf where C
    is fp16/bf16 (its error is below their rounding), in its inline-PTX form where the kernel may
    carry PTX (``ptx``: ``Backend.inline_ptx``); an fp32 C keeps libdevice's erf, whose relative
    error is 4x lower (kernels.py's module doc)."""
    if activation == "gelu" and out_dtype in (torch.float16, torch.bfloat16):
        return GELU_FAST_ERF_PTX if ptx else GELU_FAST_ERF
    return ACTIVATIONS[activation]


def precision(backend: Backend, dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: IEEE for half types; fp32 follows torch's TF32 setting."""
    if dtype != torch.float32:
        return "ieee"
    return backend.fp32_matmul_precision()


class MatmulPlan(Plan):
    def __init__(self, op: str, backend: Backend, call: MatmulCall, c_strides: tuple[int, ...],
                 selection: matmul_config.Selection | None = None) -> None:
        """``selection``: the config to plan (a first-use check's candidate or verdict) instead of
        choosing one."""

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
        # 2-D operands whose leading stride breaks the backend's matrix-unit alignment are copied
        # into an aligned buffer first (Triton cannot vectorise rows that start misaligned)
        single = n_batch == 1 and not self.materialize and not batch
        self.align_a = _realign_to(a, backend) if single else None
        self.align_b = _realign_to(b, backend) if single else None
        a_mk = _aligned_strides(a, self.align_a)
        b_kn = _aligned_strides(b, self.align_b)

        # which config, and why (matmul_config); split-K needs every (tile, split) program at once
        m_major = single and a_mk[0] == 1 and a_mk[1] != 1 and M > 1
        shape = matmul_config.Shape(M, N, Kd, n_batch, a.element_size(), split_ok=n_batch == 1 and not self.materialize,
                                    max_programs=backend.max_programs("cube", call.device), a_mmajor=m_major)
        # a residual promoting the result (bf16 x, fp32 residual) writes C in another dtype: pointer kernel
        tma = (matmul_config.tma_layout(backend, call.device, call.dtype, a.element_size(), N, a_mk, b_kn, call.bias)
               if single and not self.align_a and not self.align_b and call.result_dtype == call.dtype else None)
        key = matmul_config.bucket_key(call.dtype, shape, call.activation, call.bias is not None)
        self.res = None if call.residual is None else matmul_residual.layout(call.residual, call.out_shape)
        self.out_shape = call.out_shape
        if self.res is not None:  # tables may name it; the first-use check keys on it
            key["residual"] = True
        unforced = tuning.forced_config() is None
        self.epilogue = (call.activation if op == "linear" and unforced and call.activation in backend.vendor_epilogues
                         and call.activation in BLAS_EPILOGUES
                         and n_batch == 1 and call.dtype in (torch.float16, torch.bfloat16)
                         else None)
        if selection is not None:
            sel = selection
        elif self.epilogue:
            sel = matmul_config.Selection(
                {"VENDOR": True}, f"{backend.name} backend: vendor_epilogues",
                f"the device's BLAS applies {'bias + ' if call.bias is not None else ''}{self.epilogue} in its own "
                "epilogue: measured faster than the kernels on real-model layers", measured=True)
        elif (self.align_a or self.align_b) and backend.misaligned_to_vendor and unforced:
            sel = matmul_config.Selection(
                {"VENDOR": True}, f"{backend.name} backend: misaligned_to_vendor",
                "an operand's leading stride is misaligned: the kernel would copy it first, the device's "
                "BLAS reads it in place", measured=True)
        elif m_major and backend.m_major_a_to_vendor and unforced and not _rule_names_layout(op, backend, call,
                                                                                                key, tma):
            sel = matmul_config.Selection(
                {"VENDOR": True}, f"{backend.name} backend: m_major_a_to_vendor",
                "A is M-contiguous (a weight gradient's grad.T): no table rule measured that layout, the "
                "device's BLAS reads it in place", measured=True)
        else:  # a table rule, else the wave model, which needs evidence to beat the BLAS
            sel = matmul_evidence.gate(op, backend, call.device, key, shape, tma,
                                       matmul_config.select(op, backend, call.device, key, shape, tma),
                                       precision(backend, call.dtype))
        self.selection = sel
        cfg = sel.config
        self.source, self.why, self.measured = sel.source, sel.why, sel.measured
        self.backend = backend
        self.op = op
        self.vendor = bool(cfg.get("VENDOR"))
        if self.vendor:  # the device's own BLAS, through torch: measured faster for this shape class
            self.route = "vendor BLAS"
            bias = "bias" if call.bias is not None else "zero bias"
            self.variant = ("torch.matmul" if op == "matmul" else
                            matmul_residual.vendor_variant(call, self.epilogue) if self.res is not None else
                            f"torch._addmm_activation ({bias} + {self.epilogue} in the BLAS epilogue)" if self.epilogue
                            else "F.linear + activation") + " (the device's BLAS)"
            self.config, self.programs, self.tiles = {"VENDOR": True}, None, None
            self.tma, self.reduce_launcher, self.split_k, self.materialize = None, None, 1, False
            self.align_a = self.align_b = None
            return
        self.tma: dict[str, Any] | None = None
        self.reduce_launcher: Launcher | None = None
        self.split_k = 1
        if cfg.get("TMA") and tma:
            self._plan_tma(backend, call, cfg, M, N, Kd, tma)
        else:
            self._plan_pointer(backend, call, cfg, shape, sizes, (sa, sb, sc), a_mk, b_kn, c_strides)
        # a, b, c, bias pointers (and the residual's: its alignment is specialized, its strides planned)
        varying = (0, 1, 2, 3) if "res_ptr" not in self.jit_fn.arg_names else (
            0, 1, 2, 3, self.jit_fn.arg_names.index("res_ptr"))
        self.launcher = Launcher(backend.kernel(self.jit_fn), self.grid, self.constexprs, self.options,
                                 backend.fast_launch, varying=varying)
        if self.res is not None:
            self.variant += " + residual"
            self.config["residual"] = self.res.describe()

    def _plan_pointer(self, backend: Backend, call: MatmulCall, cfg: dict[str, Any], shape: matmul_config.Shape,
                      sizes: list[int], batch_strides: tuple[list[int], list[int], list[int]],
                      a_mk: tuple[int, int], b_kn: tuple[int, int], c_strides: tuple[int, ...]) -> None:
        from xkernels.ops.matmul import kernels as K

        M, N, Kd = shape.m, shape.n, shape.k
        sa, sb, sc = batch_strides
        bm, bn, bk = matmul_config.effective_blocks(cfg, shape)
        tiles_m, tiles_n = (M + bm - 1) // bm, (N + bn - 1) // bn
        tiles = shape.batch * tiles_m * tiles_n
        split = matmul_config.split_of(cfg, shape)
        self.split_k = split
        programs = tiles * split if split > 1 else backend.programs(tiles, "cube", call.device)
        a_full = [sa[0], sa[1], *a_mk]
        b_full = [sb[0], sb[1], *b_kn]
        c_full = [sc[0], sc[1], *c_strides[-2:]]
        self.c_mn_strides = tuple(c_full[2:])
        if split > 1:  # the main kernel writes the contiguous fp32 workspace; the reduction writes C
            c_full = [0, 0, N, 1]
        spans = [max_offset([*sizes, M, Kd], a_full), max_offset([*sizes, Kd, N], b_full),
                 max_offset([*sizes, M, N], c_full) + (split - 1) * M * N]
        index64 = max(spans) + 2**16 > INT32_MAX or (self.res is not None and self.res.wide and split == 1)
        self.jit_fn = K.matmul_residual_kernel if self.res is not None and split == 1 else K.matmul_kernel
        self.grid = (programs,)
        self.dims = (M, N, Kd, sizes[1], tiles_m, tiles_n, tiles, programs)
        self.strides = (*a_full, *b_full, *c_full)
        self.constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=int(cfg["GROUP_M"]),
                               PRECISION=precision(backend, call.dtype),
                               HAS_BIAS=call.bias is not None and split == 1,
                               ACT=ACTIVATIONS[call.activation] if split == 1 else 0, EVEN_K=Kd % bk == 0,
                               PERSISTENT=programs < tiles, INDEX_64=index64,
                               UPCAST=call.dtype == torch.bfloat16 and not backend.native_bf16_dot,
                               **_divisibility_hints(M, N, Kd, a_mk, b_kn, c_full[2:]), SPLIT_K=split)
        if self.jit_fn is K.matmul_residual_kernel:
            self.constexprs["RES"] = self.res.kind
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
        if split > 1:
            self._plan_reduction(backend, call, M, N)
        self.programs, self.tiles = programs, tiles

    def _plan_reduction(self, backend: Backend, call: MatmulCall, M: int, N: int) -> None:
        """The second launch of a split-K plan: ``splitk_reduce_kernel`` over (16, 128) tiles."""
        from xkernels.ops.layout import next_pow2
        from xkernels.ops.matmul import kernels as K

        rbm, rbn = min(16, next_pow2(M)), min(128, next_pow2(N))
        r_tiles = ((M + rbm - 1) // rbm) * ((N + rbn - 1) // rbn)
        constexprs = dict(SPLIT_K=self.split_k, BLOCK_M=rbm, BLOCK_N=rbn, HAS_BIAS=call.bias is not None,
                          ACT=ACTIVATIONS[call.activation])
        options = {"num_warps": 4} if "num_warps" in backend.launch_options else {}
        kernel, varying = K.splitk_reduce_kernel, (0, 1, 2)  # workspace, c, bias pointers
        if self.res is not None:  # the reduction adds the residual
            kernel, varying = K.splitk_reduce_residual_kernel, (0, 1, 2, 9)
            constexprs.update(RES=self.res.kind, RES_64=self.res.wide)
        self.reduce_jit_fn = kernel
        self.reduce_launcher = Launcher(backend.kernel(kernel), (r_tiles,), constexprs, options,
                                        backend.fast_launch, varying=varying)
        self.config["SPLIT_K"] = self.split_k
        self.variant += f", K split {self.split_k} ways (fp32 partials, then a reduction kernel)"

    def _plan_tma(self, backend: Backend, call: MatmulCall, cfg: dict[str, Any], M: int, N: int, Kd: int,
                  layout: matmul_config.TmaLayout) -> None:
        """``matmul_tma_kernel``: C row-major, A row-major or M-contiguous (``a_mmajor``), B
        row-major or K-contiguous (``b_kmajor``), tiles loaded through tensor descriptors.
        ``"PERSISTENT": true`` runs ``min(tiles, compute units x PROGRAMS_PER_SM)`` programs (the
        backend's ``compute_units``; ``"PROGRAMS_PER_SM"`` defaults to 1: two let one program's
        epilogue overlap the other's main loop where both fit an SM's shared memory) walking tiles
        pid, pid + nprog, ...; ``"EPILOGUE_SUBTILE": true`` stores C in two halves of BLOCK_N // 2
        columns. gelu into an fp16/bf16 C uses the fast erf (:func:`gelu_code`), its PTX form on NVIDIA."""
        from xkernels.ops.matmul import kernels as K

        bm, bn, bk = (int(cfg[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        tiles = ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
        units = backend.compute_units(call.device) if cfg.get("PERSISTENT") else None
        per_sm = max(1, int(cfg.get("PROGRAMS_PER_SM") or 1)) if units else 1
        programs = max(1, min(tiles, units * per_sm)) if units else tiles
        subtile, ws = bool(cfg.get("EPILOGUE_SUBTILE")), bool(cfg.get("WARP_SPECIALIZE"))
        c_block = [bm, bn // 2] if subtile else [bm, bn]
        a_mmajor, b_kmajor = layout.a_mmajor, layout.b_kmajor
        self.tma = {"a": [bk, bm] if a_mmajor else [bm, bk], "b": [bn, bk] if b_kmajor else [bk, bn], "c": c_block,
                    "a_mmajor": a_mmajor, "b_kmajor": b_kmajor}
        self.jit_fn = K.matmul_tma_kernel if self.res is None else K.matmul_tma_residual_kernel
        self.grid = (programs,)
        self.dims = (M, N, Kd)
        self.constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=int(cfg.get("GROUP_M", 8)),
                               HAS_BIAS=call.bias is not None,
                               ACT=gelu_code(call.activation, call.result_dtype, backend.inline_ptx(call.device)),
                               B_KMAJOR=b_kmajor,
                               PERSISTENT=bool(units), EPILOGUE_SUBTILE=subtile, A_MMAJOR=a_mmajor,
                               WARP_SPECIALIZE=ws)
        if self.res is not None:
            self.constexprs.update(RES=self.res.kind, RES_64=self.res.wide)
        self.options = {k: cfg[k] for k in backend.launch_options if cfg.get(k) is not None}
        self.variant = ("matmul" + (" + bias" if call.bias is not None else "")
                        + (f" + {call.activation}" if call.activation else "")
                        + ", tiles loaded through tensor descriptors (TMA)"
                        + (", A read as its (K, M) transpose" if a_mmajor else ""))
        self.config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": self.constexprs["GROUP_M"],
                       **self.options, "TMA": True}
        if self.constexprs["ACT"] in (GELU_FAST_ERF, GELU_FAST_ERF_PTX):
            how = (" + gelu (fast erf)" if self.constexprs["ACT"] == GELU_FAST_ERF
                   else " + gelu (fast erf, SFU rcp/ex2 by PTX)")
            self.variant = self.variant.replace(" + gelu", how, 1)
        if units:
            self.variant += (", persistent (a program per SM)" if per_sm == 1 else
                             f", persistent ({per_sm} programs per SM)")
            self.config["PERSISTENT"] = True
            if per_sm > 1:
                self.config["PROGRAMS_PER_SM"] = per_sm
        if subtile:
            self.variant += ", C stored in two column halves"
            self.config["EPILOGUE_SUBTILE"] = True
        if ws:
            self.variant += ", warp-specialized"
            self.config["WARP_SPECIALIZE"] = True
        self.programs, self.tiles = programs, tiles
    def workspace(self, device: torch.device) -> torch.Tensor:
        """The fp32 (SPLIT_K, M, N) partials of a split-K plan."""
        M, N = self.dims[0], self.dims[1]
        return torch.empty((self.split_k, M, N), dtype=torch.float32, device=device)

    def reduce_args(self, ws: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                    slope: float, residual: torch.Tensor | None = None) -> tuple[Any, ...]:
        """The reduction kernel's runtime arguments (C as the plan's 2-D (M, N) strides); with a
        residual plan, ``residual`` as :func:`matmul_residual.rows` gives it."""
        M, N = self.dims[0], self.dims[1]
        s_bias = bias.stride(0) if bias is not None else 0
        args = (ws, c, bias if bias is not None else ws, M, N, *self.c_mn_strides, s_bias, float(slope))
        return args if self.res is None else args + matmul_residual.args(residual, self.res)

    def launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
               slope: float, batch: tuple[int, ...], residual: torch.Tensor | None = None) -> None:
        if self.res is not None:
            assert residual is not None
            residual = matmul_residual.rows(residual, self.out_shape, self.res)
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
            self.reduce_launcher(*self.reduce_args(ws, c, bias, slope, residual))
            return
        self.launcher(*self.args(a, b, c, bias, slope, residual))

    def args(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
             slope: float, residual: torch.Tensor | None = None) -> tuple[Any, ...]:
        """The kernel's runtime arguments, in order (constexprs are ``self.constexprs``); a residual
        kernel's end with the residual's (``residual`` as :func:`matmul_residual.rows` gives it)."""
        bias_arg = bias if bias is not None else c
        if self.tma is not None:
            args = (*self.descriptors(a, b, c), bias_arg, *self.dims, float(slope))
        else:
            s_bias = bias.stride(0) if bias is not None else 0
            args = (a, b, c, bias_arg, *self.dims, *self.strides, s_bias, float(slope))
        if "res_ptr" not in self.jit_fn.arg_names:  # no residual, or split-K (the reduction adds it)
            return args
        return args + matmul_residual.args(residual, self.res)


    def descriptors(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[Any, Any, Any]:
        """Tensor descriptors of the 2-D operands (A as its (K, M) transpose when ``a_mmajor``, B
        as the (N, K) weight when ``b_kmajor``)."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        t = self.tma
        assert t is not None
        at = a.t() if t["a_mmajor"] else a
        bt = b.t() if t["b_kmajor"] else b
        c2 = c.view(a.shape[0], b.shape[1])
        return (TensorDescriptor(at, list(at.shape), [at.stride(0), 1], t["a"]),
                TensorDescriptor(bt, list(bt.shape), [bt.stride(0), 1], t["b"]),
                TensorDescriptor(c2, list(c2.shape), [c2.stride(0), 1], t["c"]))


def _rule_names_layout(op: str, backend: Backend, call: MatmulCall, key: dict[str, Any], tma: Any) -> bool:
    """Whether the table rule this call matches (as ``matmul_config.select`` looks it up) names
    A's layout (``"a_layout"`` in its ``when``)."""
    choice = tuning.lookup(op, backend, backend.arch(call.device), {**key, "variant": "tma"} if tma else key, {},
                           rules_only=True)
    return choice is not None and "a_layout" in choice.when


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
