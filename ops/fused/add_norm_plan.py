"""Host side of the fused residual add + norm kernel (``add_norm_kernels.py``): the call record,
the layout each operand is passed in, the config (tuning table ``add_norm.json``) and the launch.

Layouts: the kernel takes each of x, residual, s, y as rows of length N with one row stride and
unit column stride. An operand whose leading dims do not collapse into one row stride (a
transposed or step-sliced x, a residual of shape ``(1, S, N)`` broadcast over a batch) or whose
last dim is not contiguous is first copied to contiguous rows (``AddNormPlan.copies`` names them;
``explain()`` says so). A residual broadcast along every leading dim (shape ``(N,)``) is read in
place with row stride 0. Results (y, s) are contiguous; the statistics are fp32, one per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.backends import native
from xkernels.launch import Launcher
from xkernels.ops.layout import INT32_MAX, next_pow2, prod
from xkernels.ops.op import Plan

#: The config when no table rule matches: the row in one chunk up to 4096 columns, one row per
#: program, 4 warps.
DEFAULT = {"BLOCK_N": 4096, "BLOCK_M": 1, "num_warps": 4}
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class AddNormCall:
    """A validated call: the operands, what to compute, and where it runs."""

    op: str
    kind: str  # "layer" | "rms"
    x: torch.Tensor
    residual: torch.Tensor | None
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float
    offset: float
    return_sum: bool
    dtype: torch.dtype  # of s and y: torch's promotion of x and residual
    device: torch.device
    kernel_ok: bool
    fallback_reason: str = ""
    store_sum: bool = False  # write s (return_sum, or autograd keeps it)
    store_stats: bool = False  # write mean/rstd (autograd)

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    @property
    def n(self) -> int:
        return int(self.x.shape[-1]) if self.x.dim() else 1

    @property
    def rows(self) -> int:
        return prod(self.x.shape[:-1]) if self.x.dim() else 1


_row_strides: dict[Any, int | None] = {}  # (t's shape, t's strides, shape) -> row_stride's answer
_UNSEEN = object()


def row_stride(t: torch.Tensor, shape: torch.Size) -> int | None:
    """The one row stride of ``t`` expanded to ``shape`` as (rows, N) with unit column stride, or
    ``None`` when its layout needs a copy to contiguous rows. A function of ``t``'s shape and
    strides and of ``shape`` alone, kept per such triple (each backward asks for three tensors)."""
    key = (t.shape, t.stride(), tuple(shape))
    found = _row_strides.get(key, _UNSEEN)
    if found is not _UNSEEN:
        return found  # type: ignore[return-value]
    answer = _row_stride(t, shape)
    if len(_row_strides) >= 256:
        _row_strides.clear()
    _row_strides[key] = answer
    return answer


def _row_stride(t: torch.Tensor, shape: torch.Size) -> int | None:
    if t.dim() == 0:
        return 0 if len(shape) == 0 else None
    e = t.expand(shape)
    sizes, strides = list(e.shape), list(e.stride())
    if sizes[-1] > 1 and strides[-1] != 1:
        return None
    lead = [(s, st) for s, st in zip(sizes[:-1], strides[:-1]) if s != 1]
    if not lead:
        return sizes[-1]  # one row (any stride: never used)
    for (_, outer), (size, inner) in zip(lead, lead[1:]):
        if outer != inner * size:
            return None
    return lead[-1][1]


def _meta(t: torch.Tensor | None) -> Any:
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype)


def plan_key(call: AddNormCall, backend: Backend) -> Any:
    return (backend.name, call.device, call.kind, _meta(call.x), _meta(call.residual), _meta(call.weight),
            _meta(call.bias), call.store_sum, call.store_stats)


def _empty(shape: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Result allocation (one place, so tests can poison what the kernel must overwrite)."""
    return torch.empty(shape, dtype=dtype, device=device)


def allocator(backend: Backend, device: torch.device) -> Any:
    """The ``(size, stride, dtype) -> tensor`` allocation of a signature's route (one place, so
    tests can poison what the route's kernel must overwrite)."""
    return backend.allocator(device)


class AddNormPlan(Plan):
    def __init__(self, backend: Backend, call: AddNormCall) -> None:
        from xkernels.ops.fused import add_norm_kernels as K

        shape, n, rows = call.shape, call.n, call.rows
        self.backend = backend
        self.dtype = call.dtype
        self.store_sum, self.store_stats = call.store_sum, call.store_stats
        self.copies: list[str] = []
        strides = {}
        for name in ("x", "residual"):
            t = getattr(call, name)
            if t is None:
                continue
            st = row_stride(t, shape)
            if st is None:
                self.copies.append(name)
                st = n
            strides[name] = st
        key = {"norm": call.kind, "dtype": str(call.dtype).removeprefix("torch."), "n": n, "rows": rows}
        choice = tuning.lookup("add_norm", backend, backend.arch(call.device), key, DEFAULT)
        cfg = dict(choice.config)
        cap = max(16, int(cfg["BLOCK_N"]))
        block_n = min(cap, max(16, next_pow2(n)))
        block_m = max(1, min(int(cfg["BLOCK_M"]), next_pow2(rows)))
        one_chunk = n <= block_n
        tiles = max(1, (rows + block_m - 1) // block_m)
        programs = backend.programs(tiles, "vector", call.device)
        sx, sr = strides["x"], strides.get("residual", 0)
        reach = max(abs(sx), abs(sr), n) * max(rows - 1, 0) + n
        index64 = reach + 2**16 > INT32_MAX
        self.tail = (rows, n, sx, sr, n, n)  # R, N, row strides of x, residual, s, y
        self.grid = (programs,)
        self.n_tiles = tiles
        self.constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, RMS=call.kind == "rms",
                               HAS_RES=call.residual is not None, HAS_W=call.weight is not None,
                               HAS_B=call.bias is not None, STORE_SUM=call.store_sum, STORE_STATS=call.store_stats,
                               ONE_CHUNK=one_chunk, PERSISTENT=programs < tiles, INDEX_64=index64)
        self.options = {k: cfg[k] for k in backend.launch_options if cfg.get(k) is not None}
        self.config = {"BLOCK_M": block_m, "BLOCK_N": block_n, **self.options, "INDEX_64": index64}
        self.jit_fn = K.add_norm_kernel
        self.launcher = Launcher(backend.kernel(K.add_norm_kernel), self.grid, self.constexprs, self.options,
                                 backend.fast_launch)
        self.variant = ("one pass: each row tile held on chip" if one_chunk else
                        f"chunked: N={n} > BLOCK_N={block_n}, statistics merged over chunks, s recomputed "
                        f"in the second pass")
        norm = "LayerNorm" if call.kind == "layer" else "RMSNorm"
        writes = "y and s" if call.store_sum else "y only (s not written)"
        whys = [f"{norm} of x{' + residual' if call.residual is not None else ''}, writes {writes}; "
                f"{block_m} row(s) per program, {'one chunk' if one_chunk else 'chunks'} of {block_n} columns"]
        if self.copies:
            whys.append(f"{' and '.join(repr(c) for c in self.copies)} copied to contiguous rows first "
                        f"(leading dims do not collapse to one row stride, or the last dim is strided)")
        self.why = "; ".join(whys)
        self.source, self.measured = choice.source, choice.measured
        self.programs, self.tiles = programs, tiles

    def run(self, call: AddNormCall) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                                               torch.Tensor | None]:
        """(y, s or None, mean or None, rstd or None) for ``call``."""
        shape, dev, dtype = call.shape, call.device, self.dtype
        x, r = call.x, call.residual
        if "x" in self.copies:
            x = x.contiguous()
        if r is not None and "residual" in self.copies:
            r = r.expand(shape).contiguous()
        y = _empty(shape, dtype, dev)
        s = _empty(shape, dtype, dev) if self.store_sum else None
        rows = call.rows
        layer = not self.constexprs["RMS"]
        mean = _empty(rows, torch.float32, dev) if self.store_stats and layer else None
        rstd = _empty(rows, torch.float32, dev) if self.store_stats else None
        if y.numel() == 0:
            for t in (mean, rstd):  # N = 0: no statistics (torch's are NaN too)
                if t is not None:
                    t.fill_(float("nan"))
            return y, s, mean, rstd
        self.launcher(*self.args(call, x, r, y, s, mean, rstd))
        return y, s, mean, rstd

    def args(self, call: AddNormCall, x: torch.Tensor, r: torch.Tensor | None, y: torch.Tensor,
             s: torch.Tensor | None, mean: torch.Tensor | None, rstd: torch.Tensor | None) -> tuple[Any, ...]:
        """The kernel's runtime arguments, in its order (an absent operand's pointer is another
        tensor of the call, never read or written: its ``HAS_*``/``STORE_*`` constexpr is off)."""
        w, b = call.weight, call.bias
        return (x, r if r is not None else x, w if w is not None else y, b if b is not None else y,
                s if s is not None else y, y, mean if mean is not None else y, rstd if rstd is not None else y,
                *self.tail, float(call.eps), float(call.offset) or -0.0, self.n_tiles, self.grid[0])


#: Passes over the (rows, N) activations a fused add + LayerNorm saves in a training step: torch
#: moves 13 (forward: the add 3, the norm 2; backward: the norm's 3, its d(w)/d(b) kernel 2, the
#: accumulation of the sum's gradient 3), the fused op 8 (forward: x, r in, y, s out; backward:
#: s, dy, ds in, d(x) out); see ``add_norm_bwd``'s module doc.
TRAINING_PASSES_SAVED = 5


def training_fusion_pays(backend: Backend, device: torch.device, numel: int, elem_size: int) -> bool:
    """Whether a LayerNorm block's fused training call pays in eager mode on ``backend``: the
    device time of the bytes it saves (``TRAINING_PASSES_SAVED`` passes of ``numel`` elements at
    the device's copy bandwidth, measured, else its datasheet's) is at least the host time it
    costs beyond PyTorch's ops (``Backend.fused_norm_training_host_ms``). A host-bound model
    loses that host time on every block, a device-bound one gains the saved bytes' time; where
    the bytes' time is the smaller, fusing can only lose (BERT-base's blocks: ~21 us of
    traffic saved against ~205 us of host on an H100). Where the native extension records the
    call (``add_norm_native``) the premium is ``Backend.native_norm_training_host_ms``. No premium:
    always; no bandwidth known: never."""
    premium = backend.native_norm_training_host_ms if native.ready() is not None else backend.fused_norm_training_host_ms
    if premium <= 0:
        return True
    try:
        props = backend.properties(device)
    except Exception:  # noqa: BLE001 - an odd device's properties must not fail a training step
        return False
    fig = props.copy_bandwidth or props.datasheet.get("hbm_bandwidth")
    if fig is None or not fig.value:
        return False
    saved_ms = numel * elem_size * TRAINING_PASSES_SAVED / (float(fig.value) * 1e6)  # GB/s = 1e6 B/ms
    return saved_ms >= premium
