"""Which config a matmul/linear call runs, and why.

A call's *bucket key* (dtype, M, N, K, batch, epilogue) is looked up in two steps:

1. **A measured table rule.** ``ops/tuning/<backend>/<op>.json`` (and the user's autotune cache,
   consulted first) maps joint (M, N, K) ranges plus dtype/epilogue to a config measured on that
   shape class; the first matching rule wins (``xkernels.tuning.lookup``).
2. **The wave model**, where no rule matches. Every candidate config of the table's
   ``"candidates"`` section (or the built-in list, for a backend/arch without one) gets an
   estimated time, and the fastest estimate wins. The estimate counts *waves*: the call makes
   ``tiles = batch * ceil(M/BM) * ceil(N/BN) * SPLIT_K`` programs, of which the device runs
   ``compute_units`` at a time (``Backend.properties()``), so it takes ``ceil(tiles / units)``
   rounds, each as long as one tile's K loop. A 768-wide layer with 128x256 tiles and 8192 rows
   makes 192 tiles for 132 SMs: two waves, the second 45% full, where 128x128 tiles make 1.5x as
   many tiles in three full-ish waves of shorter tiles.

   A candidate with a fitted ``"cost": [a, b, c]`` (milliseconds; fitted by the tuner on measured
   times, see :func:`fit_cost`) is estimated as ``a * waves * K / SPLIT_K + b * waves + c``, and
   never below ``c`` (at least the backend's ``stream_floor`` fixed part) plus its operand bytes
   streamed at the floor's fraction of the copy bandwidth (:func:`stream_bytes_per_ms`: the fit
   knows waves, not the bandwidth they share). One
   without (an arch the tuner never ran on) is estimated from device properties alone: per wave,
   the larger of the tile's math at the unit's share of the matmul peak and the tile's operand
   bytes at its share of the copy bandwidth (:func:`analytic_ms`).

   Where the table also fits the device's own BLAS on the same measurements (a candidate
   ``{"VENDOR": true, "cost": [per GFLOP, per MB, per activation MB, fixed]}``, see
   :func:`vendor_ms`), the best kernel must be estimated ``VENDOR_ADVANTAGE`` (1.1x) faster than
   it, or the call runs the BLAS: a shape nobody measured gets a kernel only on clear evidence.
   Routes are compared by their wall estimate per call, the longer of the device estimate and
   the route's host cost (``Backend.route_host_ms``, :func:`host_ms`): a launch-bound call is
   decided by host time.

TMA candidates (``"TMA": true``) compete only where the call can load through tensor
descriptors (:func:`tma_layout`); split-K candidates only for one 2-D product with K long enough.
The wave model counts a persistent TMA config's waves as any other's (``PROGRAMS_PER_SM`` does
not change them: the tiles are the same, only how many programs share an SM).
``explain()`` prints the selection's ``source`` and ``why``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.ops.layout import next_pow2

MATMUL_DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}

#: Config keys of the tensor-descriptor kernel alone (``plan._plan_tma``): ``PERSISTENT`` (a
#: program walks several tiles), ``PROGRAMS_PER_SM`` (a persistent grid of compute units x this
#: many programs, default 1), ``EPILOGUE_SUBTILE`` (C stored in two column halves),
#: ``WARP_SPECIALIZE``. A forced config drops them where the call cannot take that kernel.
TMA_ONLY = ("TMA", "PERSISTENT", "PROGRAMS_PER_SM", "EPILOGUE_SUBTILE", "WARP_SPECIALIZE")

#: Candidates for a backend/arch whose table has no ``"candidates"`` section: tile shapes that
#: compile on every Triton target with a ``tl.dot`` (no TMA), from skinny to large.
BUILTIN_CANDIDATES: list[dict[str, Any]] = [
    {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "num_warps": w, "num_stages": s}
    for m, n, k, w, s in [(16, 64, 128, 4, 4), (32, 64, 128, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                          (128, 64, 64, 4, 4), (128, 128, 32, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3)]
]

#: Copy bandwidth over datasheet memory bandwidth, for a device whose copy rate is not cached
#: (3.0 measured against 3.35 TB/s on the H100).
COPY_OF_DATASHEET = 0.9

#: Assumed when the device reports no figures: an H100-class ratio of matmul peak to bandwidth.
DEFAULT_RIDGE_FLOP_PER_BYTE = 300.0

#: Where no rule matches and the table fits the device's own BLAS too (a ``{"VENDOR": true,
#: "cost": ...}`` candidate), the wave model picks a kernel only when its estimate beats the
#: BLAS's by this factor: both estimates come from other shapes, so a near tie is a coin toss
#: that the BLAS, tuned for every shape, wins more often (docs/tuning.md).
VENDOR_ADVANTAGE = 1.10


def host_ms(backend: Backend, cfg: dict[str, Any], shape: Shape | None = None) -> float:
    """The host ms per call of a config's route on ``backend`` (``Backend.route_host_ms``; 0 where
    the backend gives none); ``shape`` decides whether a split-K config splits. A launch-bound
    call (device time under its host cost) is decided by host time: a single threshold used to
    keep any kernel estimated under 15 us, and Gemma-2B's qkv at 77 tokens then ran a 12.9 us TMA
    kernel at 0.88x device time, where the BLAS's estimate is lower and its host cost not 1.1x
    higher (H100, 2026-11-23)."""
    costs = backend.route_host_ms
    if not costs:
        return 0.0
    if cfg.get("VENDOR"):
        return costs["vendor"]
    if cfg.get("TMA"):
        return costs["tma"]
    return costs["split"] if shape is not None and split_of(cfg, shape) > 1 else costs["pointer"]


@dataclass(frozen=True)
class Shape:
    """The GEMM a call computes: ``batch`` products of (M, K) @ (K, N)."""

    m: int
    n: int
    k: int
    batch: int
    element_size: int
    split_ok: bool  # one 2-D product (see MatmulPlan)
    max_programs: int = 2**31 - 1  # programs one launch may have (split-K needs all at once)
    a_mmajor: bool = False  # A is M-contiguous (grad.T); tables are measured on row-major A


@dataclass(frozen=True)
class Selection:
    """A config for one call, where it came from and why."""

    config: dict[str, Any]
    source: str
    why: str
    measured: bool
    estimates_ms: dict[str, float] = field(default_factory=dict)
    #: Set where the BLAS runs for want of evidence (``ops/matmul/evidence.py``): the wave model's
    #: kernel selection and the first-use check's key, which a check on the device may settle.
    pending: Any = None
    #: The matching rule's "measured" record (its shapes, times), where the config came from one.
    record: dict[str, Any] = field(default_factory=dict)


def bucket_key(dtype: torch.dtype, shape: Shape, activation: str | None, has_bias: bool) -> dict[str, Any]:
    """The fields table rules match on."""
    return {"dtype": str(dtype).removeprefix("torch."), "m": shape.m, "n": shape.n, "k": shape.k,
            "batch": shape.batch, "activation": activation or "none", "bias": has_bias,
            "a_layout": "m-major" if shape.a_mmajor else "row-major"}


class TmaLayout(NamedTuple):
    """How a call's operands load through tensor descriptors: A as its (K, M) transpose
    (``a_mmajor``: M contiguous, a weight gradient's ``grad.T``) or row-major; B as the (N, K)
    weight (``b_kmajor``) or row-major (K, N)."""

    a_mmajor: bool
    b_kmajor: bool


def tma_layout(backend: Backend, device: torch.device, dtype: torch.dtype, element_size: int, n: int,
               a_st: tuple[int, int], b_st: tuple[int, int], bias: torch.Tensor | None) -> TmaLayout | None:
    """The :class:`TmaLayout` where the call can load its operands through tensor descriptors:
    fp16/bf16, A row-major or M-contiguous, B row-major or K-contiguous, 16-byte leading
    strides and C rows, a unit-stride bias; ``None`` otherwise."""
    if dtype not in (torch.float16, torch.bfloat16) or not backend.tensor_descriptors(device):
        return None
    es = element_size
    if (n * es) % 16 or (bias is not None and bias.stride(0) != 1 and n > 1):
        return None
    if a_st[1] == 1 and (a_st[0] * es) % 16 == 0:
        a_mmajor = False
    elif a_st[0] == 1 and (a_st[1] * es) % 16 == 0:
        a_mmajor = True
    else:
        return None
    if b_st[1] == 1 and (b_st[0] * es) % 16 == 0:
        return TmaLayout(a_mmajor, False)
    if b_st[0] == 1 and (b_st[1] * es) % 16 == 0:
        return TmaLayout(a_mmajor, True)
    return None


def effective_blocks(cfg: dict[str, Any], shape: Shape) -> tuple[int, int, int]:
    """BLOCK_M/N/K as the plan clamps them to the problem (powers of two, at least 16)."""
    bm = max(16, min(int(cfg["BLOCK_M"]), next_pow2(shape.m)))
    bn = max(16, min(int(cfg["BLOCK_N"]), next_pow2(shape.n)))
    bk = max(16, min(int(cfg["BLOCK_K"]), next_pow2(max(shape.k, 1))))
    return bm, bn, bk


def split_of(cfg: dict[str, Any], shape: Shape) -> int:
    """The K split a config gets for this shape: 1 unless it is one 2-D product with K at least
    two blocks long whose every (tile, split) program fits one launch."""
    split = int(cfg.get("SPLIT_K") or 1)
    if split <= 1 or not shape.split_ok:
        return 1
    bm, bn, bk = effective_blocks(cfg, shape)
    tiles = math.ceil(shape.m / bm) * math.ceil(shape.n / bn)
    return split if shape.k >= 2 * bk and tiles * split <= shape.max_programs else 1


def waves(cfg: dict[str, Any], shape: Shape, units: int) -> tuple[int, int]:
    """(tiles, waves) of ``cfg`` on ``shape`` with ``units`` programs running at a time."""
    bm, bn, _ = effective_blocks(cfg, shape)
    tiles = shape.batch * math.ceil(shape.m / bm) * math.ceil(shape.n / bn) * split_of(cfg, shape)
    return tiles, max(1, math.ceil(tiles / max(1, units)))


def fitted_ms(cost: list[float], cfg: dict[str, Any], shape: Shape, units: int) -> float:
    """``a * waves * K / split + b * waves + c`` (see the module doc)."""
    a, b, c = cost
    _, w = waves(cfg, shape, units)
    return a * w * shape.k / split_of(cfg, shape) + b * w + c


def operand_bytes(cfg: dict[str, Any], shape: Shape) -> float:
    """Bytes a call moves at least once: A, B and C, plus a split-K plan's fp32 partials (written
    and read back)."""
    mn = shape.batch * shape.m * shape.n
    moved = (shape.batch * (shape.m + shape.n) * shape.k + mn) * shape.element_size
    split = split_of(cfg, shape)
    return moved + (mn * 4.0 * 2 * split if split > 1 else 0.0)


def copy_gbps(props: Any) -> float | None:
    """The device's copy bandwidth (GB/s): measured where cached, else its datasheet HBM
    bandwidth x ``COPY_OF_DATASHEET``; ``None`` where it reports neither."""
    if props.copy_bandwidth is not None and props.copy_bandwidth.value:
        return props.copy_bandwidth.value
    hbm = props.datasheet.get("hbm_bandwidth")
    return hbm.value * COPY_OF_DATASHEET if hbm is not None and hbm.value else None


def stream_bytes_per_ms(backend: Backend, device: torch.device) -> float | None:
    """The rate the wave model lets a GEMM stream its operands at (bytes per ms): the fraction of
    :func:`copy_gbps` in ``Backend.stream_floor``; ``None`` where the backend gives no floor or
    the device reports no bandwidth."""
    if backend.stream_floor is None:
        return None
    try:
        gbps = copy_gbps(backend.properties(device))
    except Exception:  # noqa: BLE001 - properties of an odd device must not fail a call
        return None
    return None if gbps is None else gbps * 1e6 * backend.stream_floor[1]


def analytic_ms(cfg: dict[str, Any], shape: Shape, units: int, ridge: float) -> float:
    """Relative time from device properties alone: per wave, one tile's math at a unit's share
    of the peak or its operand bytes at a unit's share of the bandwidth, whichever is longer,
    plus the split-K partials written and read once. In units of one full-device FLOP-second
    scaled to 1, so only comparisons between configs mean anything."""
    bm, bn, _ = effective_blocks(cfg, shape)
    split = split_of(cfg, shape)
    _, w = waves(cfg, shape, units)
    k = shape.k / split
    flops = 2.0 * bm * bn * k
    tile_bytes = (bm + bn) * k * shape.element_size
    per_wave = max(flops, tile_bytes * ridge) / (1.0 / units)
    reduce = (shape.m * shape.n * 4.0 * 2 * split * ridge) if split > 1 else 0.0
    return (w * per_wave + reduce) * 1e-12


def select(op: str, backend: Backend, device: torch.device, key: dict[str, Any], shape: Shape,
           tma: Any) -> Selection:
    """The config for one call (see the module doc). ``tma``: :func:`tma_layout`'s answer."""
    arch = backend.arch(device)
    forced = tuning.forced_config()
    if forced is not None:
        cfg = {**MATMUL_DEFAULT, **forced}
        if cfg.get("TMA") and not tma:
            cfg = {k: v for k, v in cfg.items() if k not in TMA_ONLY}
        return Selection(cfg, "forced by xkernels.tuning.force()", "a sweep forces this config", False)
    # rules with "variant": "tma" match only calls that can take the TMA kernel; each is followed
    # by its class's pointer-kernel rule, which the others match
    choice = tuning.lookup(op, backend, arch, {**key, "variant": "tma"} if tma else key, MATMUL_DEFAULT,
                           rules_only=True)
    if choice is not None:
        why = "a measured rule for this shape class" if choice.measured else "a table rule"
        return Selection(choice.config, choice.source, why, choice.measured, record=choice.record)
    return _model(op, backend, device, arch, key, shape, tma)


def _model(op: str, backend: Backend, device: torch.device, arch: str, key: dict[str, Any], shape: Shape,
           tma: Any) -> Selection:
    cands, source = tuning.candidates(op, backend, arch, key)
    vendor = next((c for c in cands if c.get("VENDOR")), None)
    cands = [c for c in cands if not c.get("VENDOR")]
    fitted = any("cost" in c for c in cands)
    if not cands:
        cands, source = BUILTIN_CANDIDATES, f"built-in candidates of ops/matmul/config.py (no table for {arch!r})"
    units = backend.compute_units(device) or 1
    # one read of the device's properties: the fitted model needs its streaming rate, the other its ridge
    ridge = 0.0 if fitted else _ridge(backend, device)
    stream = stream_bytes_per_ms(backend, device) if fitted else None
    # ranked by (wall, device estimate, the fit alone): at a small shape the streaming floor is
    # the same for every candidate (same operand bytes), so the fit decides among them
    best: tuple[float, float, float, dict[str, Any]] | None = None
    estimates: dict[str, float] = {}
    for cand in cands:
        cfg = {k: v for k, v in cand.items() if k != "cost"}
        if cfg.get("TMA") and not tma:
            continue
        if fitted and "cost" not in cand:
            continue  # estimates from two models are not comparable
        if fitted:
            fit = ms = fitted_ms(cand["cost"], cfg, shape, units)
            if stream:  # no faster than streaming its operands (the fit has no shared-bandwidth term)
                ms = max(ms, max(cand["cost"][2], backend.stream_floor[0]) + operand_bytes(cfg, shape) / stream)
            wall = max(ms, host_ms(backend, cfg, shape))
        else:
            fit = ms = wall = analytic_ms(cfg, shape, units, ridge)  # relative units: no host term
        estimates[_label(cfg)] = ms
        if best is None or (wall, ms, fit) < best[:3]:
            best = (wall, ms, fit, cfg)
    if best is None:
        return Selection(dict(MATMUL_DEFAULT), f"built-in default of op {op!r}", "no candidate applies", False)
    wall, ms, _, chosen = best
    cfg = {**MATMUL_DEFAULT, **chosen}
    tiles, w = waves(cfg, shape, units)
    how = "fitted costs" if fitted else "device properties (no fitted costs for this arch)"
    why = (f"wave model over {len(estimates)} candidates from {how}: {tiles} tiles on {units} compute units "
           f"= {w} wave{'s' if w > 1 else ''}")
    if fitted and vendor is not None and "cost" in vendor:
        blas = vendor_ms(vendor["cost"], shape, key.get("activation", "none") != "none")
        blas_wall = max(blas, host_ms(backend, {"VENDOR": True}))
        estimates["device BLAS"] = blas
        bound = " (launch-bound: host cost)" if wall > ms else ""
        if wall * VENDOR_ADVANTAGE > blas_wall:
            return Selection({"VENDOR": True}, source,
                             f"{why}; its best kernel ({_label(cfg)}, {wall * 1e3:.1f} us per call estimated{bound}) "
                             f"is not {VENDOR_ADVANTAGE:g}x faster than the device's BLAS ({blas_wall * 1e3:.1f} us, "
                             f"fitted on the same measurements)", False, estimates)
        why += (f"; {wall * 1e3:.1f} us per call estimated{bound}, {VENDOR_ADVANTAGE:g}x faster than the device's "
                f"BLAS ({blas_wall * 1e3:.1f} us)")
    return Selection(cfg, source, why, False, estimates)


def vendor_features(shape: Shape, activation: bool) -> list[float]:
    """What the device's BLAS time is fitted on: GFLOP, MB of operands and result, MB of the
    separate activation pass (read + write; 0 without one), and 1."""
    mn = shape.batch * shape.m * shape.n
    gflop = 2.0 * mn * shape.k * 1e-9
    mb = (shape.batch * (shape.m + shape.n) * shape.k + mn) * shape.element_size * 1e-6
    return [gflop, mb, 2.0 * mn * shape.element_size * 1e-6 if activation else 0.0, 1.0]


def vendor_ms(cost: list[float], shape: Shape, activation: bool) -> float:
    """The fitted time of the device's BLAS (torch's call, plus its activation) on ``shape``."""
    return sum(c * f for c, f in zip(cost, vendor_features(shape, activation)))


def fit_vendor_cost(points: list[tuple[Shape, bool, float]]) -> list[float] | None:
    """Non-negative ``[per GFLOP, per MB, per activation MB, fixed]`` (ms) of the device's BLAS
    from measured (shape, has activation, torch ms), relative error weighted, refitted without
    points off by more than 2x; ``None`` with fewer than four points."""
    pts = list(points)
    coef: list[float] | None = None
    for _ in range(3):
        if len(pts) < 4:
            break
        coef = _nnls([([f / ms for f in vendor_features(s, act)], 1.0) for s, act, ms in pts], 4)
        keep = [(s, a, ms) for s, a, ms in pts if 0.5 < ms / max(vendor_ms(coef, s, a), 1e-9) < 2.0]
        if len(keep) == len(pts):
            break
        pts = keep
    return coef


def _ridge(backend: Backend, device: torch.device) -> float:
    """Matmul peak over copy bandwidth (FLOP per byte): the measured figures where cached, else
    the datasheet's (dense bf16/fp16 TFLOP/s; HBM bandwidth x ``COPY_OF_DATASHEET``)."""
    try:
        props = backend.properties(device)
    except Exception:  # noqa: BLE001 - properties of an odd device must not fail a call
        return DEFAULT_RIDGE_FLOP_PER_BYTE
    sheet = props.datasheet
    peak = props.matmul_peak or sheet.get("bf16_tflops") or sheet.get("fp16_tflops")
    gbps = copy_gbps(props)
    if peak and peak.value and gbps:
        return peak.value * 1e12 / (gbps * 1e9)
    return DEFAULT_RIDGE_FLOP_PER_BYTE


def _label(cfg: dict[str, Any]) -> str:
    flags = "".join(f"+{f.lower()}" for f in ("TMA", "PERSISTENT", "EPILOGUE_SUBTILE", "WARP_SPECIALIZE")
                    if cfg.get(f))
    if cfg.get("PERSISTENT") and int(cfg.get("PROGRAMS_PER_SM") or 1) > 1:
        flags += f"+x{int(cfg['PROGRAMS_PER_SM'])}_per_sm"
    split = f"/split{cfg['SPLIT_K']}" if int(cfg.get("SPLIT_K") or 1) > 1 else ""
    return (f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} w{cfg.get('num_warps')} "
            f"s{cfg.get('num_stages')}{split}{flags}")


def fit_cost(points: list[tuple[Shape, float]], cfg: dict[str, Any], units: int) -> list[float] | None:
    """Least-squares ``[a, b, c] >= 0`` of :func:`fitted_ms` on measured (shape, ms) points,
    relative error weighted, refitted twice without points off by more than 2x (one-off
    slow measurements). ``None`` with fewer than three points. The device's BLAS
    (``{"VENDOR": true}``) has no tiles to count: its times are fitted by :func:`fit_vendor_cost`."""
    if cfg.get("VENDOR"):
        raise ValueError(f"fit_cost fits kernel configs (tiles, waves); {cfg} is the device's BLAS: "
                         f"fit its times with fit_vendor_cost")
    pts = list(points)
    coef: list[float] | None = None
    for _ in range(3):
        if len(pts) < 3:
            break
        coef = _nnls_fit(pts, cfg, units)
        keep = [(s, ms) for s, ms in pts if 0.5 < ms / max(fitted_ms(coef, cfg, s, units), 1e-9) < 2.0]
        if len(keep) == len(pts):
            break
        pts = keep
    return coef


def _nnls_fit(points: list[tuple[Shape, float]], cfg: dict[str, Any], units: int) -> list[float]:
    rows = []
    for s, ms in points:
        _, w = waves(cfg, s, units)
        rows.append(([w * s.k / split_of(cfg, s) / ms, w / ms, 1.0 / ms], 1.0))
    return _nnls(rows, 3)


def _nnls(rows: list[tuple[list[float], float]], n: int) -> list[float]:
    """Non-negative least squares by projected coordinate descent (no SciPy)."""
    x = [0.0] * n
    for _ in range(2000):
        for j in range(n):
            num = sum(r[j] * (y - sum(r[i] * x[i] for i in range(n) if i != j)) for r, y in rows)
            den = sum(r[j] * r[j] for r, _ in rows)
            x[j] = max(0.0, num / den) if den else 0.0
    return x
