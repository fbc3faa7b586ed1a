"""Which route a ``gated_linear`` call takes, with which config, and how it launches.

Two routes (``explain()`` names the one a call takes, its config and the rule that chose it):

* **fused kernel** (``gated_linear_kernels.gated_linear_kernel``, or on sm90+ for 2-D fp16/bf16
  calls whose rows are 16-byte aligned and whose config says ``"TMA": true``,
  ``gated_linear_tma_kernel``): x read once, two fp32 accumulators, one output write;
* **vendor BLAS + gate kernel** (a ``{"VENDOR": true}`` config): ``F.linear`` (the device's BLAS)
  computes gate and up (one GEMM against a concatenated gate_up weight, two otherwise), then
  ``gate_kernel`` reads both once and writes ``act(gate) * up``.

Selection, first match wins: a config forced by ``xkernels.tuning.force()`` (sweeps, tests); a
rule of ``ops/tuning/<backend>/gated_linear.json`` (user cache and plugin tables first), matched
on the bucket key of :func:`bucket_key` (dtype, M, N = the intermediate size I, K = the hidden
size, activation, bias, weight form, and ``variant: tma`` where the TMA kernel can run); else the
built-in default, the fused kernel with :data:`GATED_DEFAULT`. The cuda table's catch-all rule
sends every shape no measurement covers to the vendor route (do no harm: the fused kernel has not
been timed against cuBLAS); the interpreter and npu tables give the fused kernel's tiles.

The wave model of ``ops/matmul/config.py`` is not used: its per-config costs are fitted on
``linear``'s single-accumulator configs and its vendor fit on one GEMM with one output, neither
of which describes two accumulators per tile (twice the math and registers per tile) or two
GEMMs plus the gate pass; reusing them would pick routes from numbers measured for another
kernel.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.launch import Launcher
from xkernels.ops.layout import INT32_MAX, max_offset, next_pow2
from xkernels.ops.matmul import config as matmul_config
from xkernels.ops.matmul.plan import ACTIVATIONS, precision
from xkernels.ops.matmul.pre_activation import Remembered
from xkernels.ops.op import Plan

if TYPE_CHECKING:
    from xkernels.ops.fused.gated_linear import GatedCall

OP = "gated_linear"
GATED_DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
#: ``gate_kernel``'s tile (element-wise: rows of the output, up to 256 columns)
GATE_BLOCK = (16, 256)
#: its columns where an operand's columns are strided (GPT-OSS's interleaved gate_up): Ascend's
#: compiler stages such a load through the unified buffer, which a 256-wide tile overflows (the
#: offline check: 640 KiB forward, 1408 KiB backward, of the A2's 192)
STRIDED_BLOCK_N = 32
_TMA_KEYS = matmul_config.TMA_ONLY


def _empty(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The plan's allocations (the output, and gate and up where kept): one place, so that tests
    can hand out NaN-filled memory and see every element written."""
    return torch.empty(shape, dtype=dtype, device=device)


def bucket_key(call: GatedCall) -> dict[str, Any]:
    """The fields table rules match on: as ``linear``'s (M, N, K: N is I, the output width; K the
    hidden size), plus ``weight``: ``"concatenated"`` (Phi-3's gate_up) or ``"separate"``."""
    m, k = call.x2.shape
    return {"dtype": str(call.dtype).removeprefix("torch."), "m": m, "n": call.wg.shape[0], "k": k, "batch": 1,
            "activation": call.activation, "bias": call.bg is not None or call.bu is not None,
            "weight": "concatenated" if call.concatenated else "separate"}


def tma_ok(backend: Backend, call: GatedCall) -> bool:
    """Whether the TMA kernel can run the call: sm90+ tensor descriptors, fp16/bf16, x row-major
    and both weights K-contiguous with 16-byte rows, I a multiple of 16 bytes, unit-stride biases,
    K > 0."""
    if call.dtype not in (torch.float16, torch.bfloat16) or not backend.tensor_descriptors(call.device):
        return False
    es = call.x2.element_size()
    m, k = call.x2.shape
    if k == 0 or m == 0 or (call.wg.shape[0] * es) % 16:
        return False
    for t in (call.x2, call.wg, call.wu):
        if t.stride(1) != 1 or (t.stride(0) * es) % 16:
            return False
    return all(b is None or b.stride(0) == 1 for b in (call.bg, call.bu))


def select(backend: Backend, call: GatedCall, tma: bool) -> matmul_config.Selection:
    """The route and config of one call (see the module doc)."""
    forced = tuning.forced_config()
    if forced is not None:
        cfg = {**GATED_DEFAULT, **forced}
        if cfg.get("TMA") and not tma:
            cfg = {k: v for k, v in cfg.items() if k not in _TMA_KEYS}
        return matmul_config.Selection(cfg, "forced by xkernels.tuning.force()", "a sweep or test forces this config",
                                       False)
    key = bucket_key(call)
    choice = tuning.lookup(OP, backend, backend.arch(call.device), {**key, "variant": "tma"} if tma else key,
                           GATED_DEFAULT, rules_only=True)
    if choice is not None:
        if choice.config.get("VENDOR"):
            why = ("a measured rule: the device's BLAS won this class" if choice.measured else
                   "a table rule: no measurement shows the fused kernel beating the device's BLAS here, so the "
                   "vendor route runs (see the table's source)")
        else:
            why = "a measured rule for this shape class" if choice.measured else "a table rule"
        return matmul_config.Selection(choice.config, choice.source, why, choice.measured, record=choice.record)
    return matmul_config.Selection(dict(GATED_DEFAULT), f"built-in default of op {OP!r} (no table rule matched)",
                                   "no rule covers this shape: the fused kernel", False)


class GatedPlan(Plan):
    """One call signature's route and launches."""

    def __init__(self, backend: Backend, call: GatedCall) -> None:
        M, K = call.x2.shape
        N = call.wg.shape[0]
        self.backend, self.dims = backend, (M, N, K)
        tma = tma_ok(backend, call)
        sel = select(backend, call, tma)
        cfg = sel.config
        self.source, self.why, self.measured = sel.source, sel.why, sel.measured
        self.record = sel.record  # the rule's "measured" record (ops/fused/gated_linear_compiled.py reads it)
        self.vendor = bool(cfg.get("VENDOR"))
        self.save = call.save
        self.tma: dict[str, Any] | None = None
        if self.vendor:
            self._plan_vendor(backend, call, M, N)
        elif cfg.get("TMA") and tma:
            self._plan_tma(backend, call, cfg, M, N, K)
        else:
            self._plan_pointer(backend, call, cfg, M, N, K)

    # -- planning -----------------------------------------------------------------------------
    def _plan_vendor(self, backend: Backend, call: GatedCall, M: int, N: int) -> None:
        self.route = "vendor BLAS + gate kernel"
        gemms = ("one F.linear against the concatenated gate_up weight" if call.concatenated
                 else "two F.linear (gate, up)")
        self.variant = f"{gemms} (the device's BLAS), then act(gate) * up in one Triton pass ({call.activation})"
        g_stride = 2 * N if call.concatenated else N  # F.linear's contiguous (M, 2N) or (M, N) result
        gate = GatePlan(backend, call.device, M, N, call.activation, (g_stride, 1, g_stride, 1, N, 1))
        self.gate_dims = gate.tail
        self.jit_fn, self.constexprs, self.launcher = gate.jit_fn, gate.launcher.constexprs, gate.launcher
        self.config = {"VENDOR": True, "gate BLOCK_M": gate.constexprs["BLOCK_M"],
                       "gate BLOCK_N": gate.constexprs["BLOCK_N"], "INDEX_64": gate.constexprs["INDEX_64"]}
        self.programs, self.tiles = gate.programs, gate.tiles

    def _plan_pointer(self, backend: Backend, call: GatedCall, cfg: dict[str, Any], M: int, N: int, K: int) -> None:
        from xkernels.ops.fused import gated_linear_kernels as GK

        shape = matmul_config.Shape(M, N, K, 1, call.x2.element_size(), split_ok=False)
        bm, bn, bk = matmul_config.effective_blocks(cfg, shape)
        tiles = ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
        programs = backend.programs(tiles, "cube", call.device)
        x, wg, wu = call.x2, call.wg, call.wu
        spans = [max_offset([M, K], list(x.stride())), max_offset([N, K], list(wg.stride())),
                 max_offset([N, K], list(wu.stride())), M * N]
        index64 = max(spans) + 2**16 > INT32_MAX
        self.strides = (*x.stride(), *wg.stride(), *wu.stride(), N, 1,
                        call.bg.stride(0) if call.bg is not None else 0, call.bu.stride(0) if call.bu is not None else 0)
        self.constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=int(cfg.get("GROUP_M", 8)),
                               PRECISION=precision(backend, call.dtype), HAS_BIAS=call.bg is not None,
                               HAS_UP_BIAS=call.bu is not None, ACT=ACTIVATIONS[call.activation],
                               EVEN_K=K % bk == 0, PERSISTENT=programs < tiles, INDEX_64=index64,
                               UPCAST=call.dtype == torch.bfloat16 and not backend.native_bf16_dot,
                               STORE_PRE=call.save)
        self.options = {k: cfg[k] for k in backend.launch_options if cfg.get(k) is not None}
        self.jit_fn = GK.gated_linear_kernel
        self.launcher = Launcher(backend.kernel(GK.gated_linear_kernel), (programs,), self.constexprs, self.options,
                                 backend.fast_launch, varying=tuple(range(8)))
        self.route = "triton kernel"
        self.variant = self._variant(call, "x read once, gate and up accumulated together")
        self.config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": self.constexprs["GROUP_M"],
                       "PRECISION": self.constexprs["PRECISION"], **self.options, "INDEX_64": index64}
        self.programs, self.tiles = programs, tiles

    def _plan_tma(self, backend: Backend, call: GatedCall, cfg: dict[str, Any], M: int, N: int, K: int) -> None:
        """The TMA kernel under the config's schedule options, as ``linear``'s TMA plan reads them:
        ``PERSISTENT`` (``min(tiles, compute units x PROGRAMS_PER_SM)`` programs) and
        ``EPILOGUE_SUBTILE`` (y, gate and up stored in column halves: their descriptors' block is
        (BLOCK_M, BLOCK_N // 2)). ``WARP_SPECIALIZE`` is refused (the kernel's doc says why)."""
        from xkernels.ops.fused import gated_linear_kernels as GK

        bm, bn, bk = (int(cfg[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        tiles = ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
        units = backend.compute_units(call.device) if cfg.get("PERSISTENT") else None
        per_sm = max(1, int(cfg.get("PROGRAMS_PER_SM") or 1)) if units else 1
        programs = max(1, min(tiles, units * per_sm)) if units else tiles
        if cfg.get("WARP_SPECIALIZE"):
            raise ValueError(f"gated_linear: config {cfg} asks for WARP_SPECIALIZE, which its TMA kernel does not "
                             "take (Triton 3.6's warp specialization wrote NaN into its output on an H100)")
        subtile = bool(cfg.get("EPILOGUE_SUBTILE")) and bn % 2 == 0
        self.tma = {"x": [bm, bk], "w": [bn, bk], "y": [bm, bn // 2 if subtile else bn]}
        self.constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=int(cfg.get("GROUP_M", 8)),
                               HAS_BIAS=call.bg is not None, HAS_UP_BIAS=call.bu is not None,
                               ACT=ACTIVATIONS[call.activation], STORE_PRE=call.save, PERSISTENT=bool(units),
                               EPILOGUE_SUBTILE=subtile)
        self.options = {k: cfg[k] for k in backend.launch_options if cfg.get(k) is not None}
        self.jit_fn = GK.gated_linear_tma_kernel
        self.launcher = Launcher(backend.kernel(GK.gated_linear_tma_kernel), (programs,), self.constexprs,
                                 self.options, backend.fast_launch, varying=tuple(range(8)))
        self.route = "triton kernel"
        schedule = [s for s, on in ((f"persistent ({per_sm} program{'s' if per_sm > 1 else ''} per SM)", units),
                                    ("epilogue in column halves", subtile)) if on]
        self.variant = self._variant(call, "tiles loaded through tensor descriptors (TMA)") + "".join(
            f", {s}" for s in schedule)
        self.config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": self.constexprs["GROUP_M"],
                       **self.options, "TMA": True, **({"PERSISTENT": True} if units else {}),
                       **({"PROGRAMS_PER_SM": per_sm} if per_sm > 1 else {}),
                       **({"EPILOGUE_SUBTILE": True} if subtile else {})}
        self.programs, self.tiles = programs, tiles

    @staticmethod
    def _variant(call: GatedCall, how: str) -> str:
        weight = "concatenated gate_up weight" if call.concatenated else "separate gate and up weights"
        biases = [n for n, b in (("gate bias", call.bg), ("up bias", call.bu)) if b is not None]
        return (f"fused gate/up GEMM ({weight}{', ' + ', '.join(biases) if biases else ''}) + {call.activation}(gate)"
                f" * up, {how}" + (", gate and up kept for the backward" if call.save else ""))

    # -- running ------------------------------------------------------------------------------
    def run(self, call: GatedCall) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(y (M, N), gate, up): gate and up where the call saves them (``call.save``) or the
        vendor route made them anyway, else ``None``."""
        M, N, K = self.dims
        y = _empty((M, N), call.dtype, call.device)
        if self.vendor:
            F = torch.nn.functional
            if call.concatenated:
                gu = F.linear(call.x2, call.weight, call.bias)
                g, u = gu[:, :N], gu[:, N:]
            else:
                g, u = F.linear(call.x2, call.wg, call.bg), F.linear(call.x2, call.wu, call.bu)
            self.launcher(*self.args(call, y, g, u))
            return y, g, u
        g = _empty((M, N), call.dtype, call.device) if self.save else None
        u = _empty((M, N), call.dtype, call.device) if self.save else None
        if self.tma is not None:
            bg = call.bg if call.bg is not None else y
            bu = call.bu if call.bu is not None else y
            self.launcher(*self.descriptors(call, y, g, u), bg, bu, M, N, K)
        else:
            self.launcher(*self.args(call, y, g, u))
        return y, g, u

    def args(self, call: GatedCall, y: torch.Tensor, g: torch.Tensor | None,
             u: torch.Tensor | None) -> tuple[Any, ...]:
        """The runtime arguments of the pointer kernel (``self.jit_fn``), in its order: ``g``/``u``
        the pre-activation outputs where kept (``None``: y stands in, never written). Vendor
        route: ``gate_kernel``'s, with ``g``/``u`` the BLAS results."""
        if self.vendor:
            assert g is not None and u is not None
            return (g, u, y, *self.gate_dims)
        M, N, K = self.dims
        bg = call.bg if call.bg is not None else y
        bu = call.bu if call.bu is not None else y
        return (call.x2, call.wg, call.wu, y, bg, bu, g if g is not None else y, u if u is not None else y,
                M, N, K, self.tiles, self.programs, *self.strides)

    def descriptors(self, call: GatedCall, y: torch.Tensor, g: torch.Tensor | None,
                    u: torch.Tensor | None) -> tuple[Any, ...]:
        """Tensor descriptors of x, the two weights, y, gate and up (y stands in for gate and up
        when they are not stored). Bases must be 16-byte aligned: a misaligned one is copied."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        t = self.tma
        assert t is not None

        def desc(v: torch.Tensor, block: list[int]) -> Any:
            if v.data_ptr() & 15:
                v = v.clone()  # a fresh allocation: aligned, same strides
            return TensorDescriptor(v, list(v.shape), [v.stride(0), 1], block)

        yd = desc(y, t["y"])
        return (desc(call.x2, t["x"]), desc(call.wg, t["w"]), desc(call.wu, t["w"]), yd,
                desc(g, t["y"]) if g is not None else yd, desc(u, t["y"]) if u is not None else yd)


# -- the backward's element-wise half ---------------------------------------------------------------
#: dtypes ``gate_grad_kernel`` reads and writes (others take PyTorch's ops)
GRAD_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_GRAD_PLANS_MAX = 64


def gate_grid(backend: Backend, device: Any, M: int, N: int,
              strides: tuple[int, ...] = ()) -> tuple[int, int, int, int, dict[str, Any]]:
    """The element-wise tiles of ``gate_kernel`` and ``gate_grad_kernel`` over an (M, N) result:
    ``(BLOCK_M, BLOCK_N, tiles, programs, launch options)``, up to ``GATE_BLOCK`` per tile
    (``STRIDED_BLOCK_N`` columns where an operand's columns are not contiguous: ``strides`` holds
    each operand's (row, column) strides), the backend's vector grid (persistent where it caps
    the tiles)."""
    strided = any(strides[i] != 1 for i in range(1, len(strides), 2))
    bm, bn = min(GATE_BLOCK[0], next_pow2(M)), min(STRIDED_BLOCK_N if strided else GATE_BLOCK[1], next_pow2(N))
    tiles = ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
    options = {"num_warps": 4} if "num_warps" in backend.launch_options else {}
    return bm, bn, tiles, backend.programs(tiles, "vector", device), options


@dataclasses.dataclass(frozen=True)
class ClampedGlu:
    """GPT-OSS's gate in place of ``act(gate) * up``: ``(clamp(up, -limit, limit) + shift) * c *
    sigmoid(alpha * c)`` for ``c = min(gate, limit)`` (GPT-OSS: alpha 1.702, limit 7, shift 1;
    DeepSeek-V4's ``silu(c) * clamp(up)``: alpha 1, shift 0)."""

    alpha: float
    limit: float
    shift: float

    def floats(self) -> tuple[float, float, float]:
        return float(self.alpha), float(self.limit), float(self.shift)


_NO_GLU = (0.0, 0.0, 0.0)  # the kernels' ALPHA, LIMIT, SHIFT where CLAMPED is off (unused)


class GatePlan:
    """``gate_kernel``'s launch over one (M, N) result of gate and up given by their strides: its
    tiles, grid and 64-bit indexing (``gated_linear``'s vendor route and ``gated_activation.py``'s
    pass; also made on meta tensors by ``gated_linear_compile`` for the offline npu check).
    ``glu``: the clamped GLU instead of ``act(gate) * up``."""

    def __init__(self, backend: Any, device: torch.device, M: int, N: int, activation: str | None,
                 strides: tuple[int, ...], glu: ClampedGlu | None = None) -> None:
        from xkernels.ops.fused import gated_linear_kernels as GK

        bm, bn, tiles, programs, options = gate_grid(backend, device, M, N, strides)
        spans = [max_offset([M, N], list(strides[i:i + 2])) for i in range(0, 6, 2)]
        self.constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, ACT=ACTIVATIONS[activation if glu is None else None],
                               PERSISTENT=programs < tiles, INDEX_64=max(spans) + 2**16 > INT32_MAX,
                               CLAMPED=glu is not None)
        self.jit_fn = GK.gate_kernel
        self.launcher = Launcher(backend.kernel(GK.gate_kernel), (programs,), self.constexprs, options,
                                 backend.fast_launch, varying=(0, 1, 2))
        self.tail = (M, N, tiles, programs, *strides, *(_NO_GLU if glu is None else glu.floats()))
        self.programs, self.tiles = programs, tiles


class GateGradPlan:
    """The launch of ``gate_grad_kernel`` for one (M, N), dtype, activation (or clamped GLU) and set
    of strides on one backend and device: ``gate_kernel``'s tiles and grid (element-wise, up to 256
    columns)."""

    def __init__(self, backend: Backend, device: torch.device, M: int, N: int, activation: str | None,
                 strides: tuple[int, ...], glu: ClampedGlu | None = None) -> None:
        from xkernels.ops.fused import gated_linear_kernels as GK

        bm, bn, tiles, programs, options = gate_grid(backend, device, M, N, strides)
        spans = [max_offset([M, N], list(strides[i:i + 2])) for i in range(0, 10, 2)]
        self.constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, ACT=ACTIVATIONS[activation if glu is None else None],
                               PERSISTENT=programs < tiles, INDEX_64=max(spans) + 2**16 > INT32_MAX,
                               CLAMPED=glu is not None)
        self.jit_fn = GK.gate_grad_kernel
        self.launcher = Launcher(backend.kernel(GK.gate_grad_kernel), (programs,), self.constexprs, options,
                                 backend.fast_launch, varying=(0, 1, 2, 3, 4))
        self.tail = (M, N, tiles, programs, *strides, *(_NO_GLU if glu is None else glu.floats()))

    def args(self, dy: torch.Tensor, g: torch.Tensor, u: torch.Tensor, dg: torch.Tensor,
             du: torch.Tensor) -> tuple[Any, ...]:
        return (dy, g, u, dg, du, *self.tail)


#: the element-wise passes' plans, per signature (at most 64: a model has few; ``gated_activation``'s too)
_grad_plans = Remembered(_GRAD_PLANS_MAX)
gate_plans = Remembered(_GRAD_PLANS_MAX)


def gate_grads(backend: Backend, dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str | None,
               concatenated: bool, glu: ClampedGlu | None = None,
               interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """``(d_gate, d_up, d)`` of the (M, I) output gradient ``dy`` and the kept ``gate`` and ``up``
    (any strides), by one ``gate_grad_kernel`` launch: ``d`` the (M, 2I) buffer whose halves (or,
    ``interleaved``, whose even and odd columns) are ``d_gate`` and ``d_up`` for a concatenated
    weight, else ``None``. ``glu``: the clamped GLU's gradients instead of ``act(gate) * up``'s.
    ``None`` where the kernel does not apply (a backend that runs no Triton, another dtype, mixed
    dtypes or devices): the caller computes them with PyTorch's ops."""
    dtype = gate.dtype
    if (not backend.runs_triton or dtype not in GRAD_DTYPES or dy.dtype != dtype or up.dtype != dtype
            or dy.device != gate.device or up.device != gate.device or dy.shape != gate.shape
            or up.shape != gate.shape or dy.dim() != 2):
        return None
    M, N = gate.shape
    if concatenated:
        d = _empty((M, 2 * N), dtype, gate.device)
        dg, du = (d[:, 0::2], d[:, 1::2]) if interleaved else (d[:, :N], d[:, N:])
    else:
        d, dg, du = None, _empty((M, N), dtype, gate.device), _empty((M, N), dtype, gate.device)
    if M and N:
        strides = (*dy.stride(), *gate.stride(), *up.stride(), *dg.stride(), *du.stride())
        key = (backend.name, gate.device, dtype, M, N, activation, glu, strides)
        plan = _grad_plans.get(key, lambda: GateGradPlan(backend, gate.device, M, N, activation, strides, glu))
        plan.launcher(*plan.args(dy, gate, up, dg, du))
    return dg, du, d
