"""Whether a matmul/linear kernel may run instead of the device's BLAS: the evidence.

On a backend with a BLAS to fall back on (``Backend.kernel_needs_evidence``: cuda), a Triton
kernel is chosen only where measurement supports it; the wave model (``matmul_config``) still
ranks the kernel configs, but its estimate alone never overrides the BLAS. In order:

1. **A measured rule** covering the call (``matmul_config.select``: a table rule with a
   ``"measured"`` record, shipped or from the user's autotune cache): its kernel runs where the
   rule measured it at least as fast as the BLAS (``worst_ratio`` >= :data:`RULE_FLOOR`, 1.0);
   a rule whose kernel measured slower (a near tie the tables kept, a pointer-kernel rule
   behind its class's TMA rule) runs the BLAS. Where the rule's measured BLAS time is
   *launch-bound* (:func:`launch_bound`: under the BLAS route's host cost,
   ``Backend.route_host_ms``), its kernel must have measured :data:`LAUNCH_BOUND_MARGIN` (1.10x)
   faster, else the BLAS runs.
2. **A first-use verdict** for the call's *check key* (:func:`check_key`): remembered in this
   process, or in ``<cache dir>/first_use/<op>.json`` from an earlier process on the same device
   with the same versions.
3. **Agreeing neighbours** (:func:`neighbours`). A neighbour is a measured point (a table rule's
   ``"measured"`` shape, or a first-use verdict of this device) of the same op, dtype, epilogue
   (activation and bias), batch, A layout and kernel variant (TMA or pointer), with the *same N
   and K* and an M within a factor of :data:`NEIGHBOUR_M_FACTOR` (2) of the call's. Table points
   are taken from the rule a call at that M would take (the tables' own first-match order). The
   neighbours *agree* when there is at least one at M' <= M and one at M' >= M (the call lies
   between measured points, or on one) and every neighbour in the window measured its kernel at
   least :data:`NEIGHBOUR_MARGIN` (1.10x) faster than the BLAS (a rule's worst ratio; a
   ``VENDOR`` rule counts as a loss). The call then runs the config of the nearest (in log M).
4. **A first-use check** (:func:`first_use`), where none of the above decides and the check may
   run (on by default; ``XKERNELS_FIRST_USE_CHECK=0`` or ``xkernels.tuning.first_use_check(False)``
   turn it off; never while ``torch.compile`` traces or a CUDA graph is being captured): the
   wave model's kernel and the BLAS route run on the call's own inputs (into fresh outputs),
   :data:`CHECK_ROUNDS` interleaved rounds behind cache flushes (``xkernels.interleave``); the
   kernel wins only if its cost per call (device time, or the route's measured host cost where
   larger: ``Backend.route_host_ms``) beats the BLAS's by :data:`CHECK_MARGIN` (1.05x) *and* its device time
   is at least :data:`DEVICE_FLOOR` (0.95x) of the BLAS's; where the BLAS's device time is
   launch-bound, at least :data:`LAUNCH_BOUND_MARGIN` (1.10x): a few-microsecond call's timings
   vary by about 10% between the check and a later measurement, so a cheaper host route never
   buys a kernel that may then lose on the device (all that is left under CUDA-graph replay).
   The verdict is remembered in the process and on disk; threads that meet the same new key
   wait for one check.
5. Otherwise **the BLAS**.

The check key holds everything the choice depends on: op, backend, device (arch and name),
versions (torch, its CUDA/HIP, Triton, xkernels), dtype, M's power-of-two bucket, N, K, batch,
activation, bias, A's layout, the TMA layout (or none), and for float32 the matmul precision.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import math
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from xkernels import interleave, tuning
from xkernels.backend import Backend
from xkernels.ops.matmul.config import Selection, Shape, _label, effective_blocks, host_ms, waves

NEIGHBOUR_M_FACTOR = 2.0
NEIGHBOUR_MARGIN = 1.10
CHECK_ROUNDS = 5
CHECK_MARGIN = 1.05
DEVICE_FLOOR = 0.95
RULE_FLOOR = 1.0
#: How much faster than the BLAS a kernel must have measured, on the device, where the BLAS's
#: measured device time is launch-bound (:func:`launch_bound`), for a rule or a first-use verdict
#: to count. Such timings move by up to ~11% between the evidence and a later interleaved
#: measurement (H100, 2026-11-24: rules at 1.017x / 1.026x confirmed at 0.915x / 0.933x in the
#: public corpus bench; the worst bench / evidence ratio of a launch-bound kernel over the corpus
#: and held-out runs is 0.89, two calls just above the host cost 0.87: ``tools/evidence_replay.py``),
#: so a thinner margin does not keep the kernel within 0.95x of the BLAS. The same 10% as neighbours'.
LAUNCH_BOUND_MARGIN = 1.10
#: the verdict rule's version, part of every check key: verdicts cached under an older rule are not reused
VERDICT_RULE = 3

#: ``timer(fns, backend, device) -> [[kernel ms, BLAS ms], ...]`` (one row per round): the
#: first-use check's clock (tests replace it).
Timer = Callable[[list[Callable[[], Any]], Backend, torch.device], list[list[float]]]


def _device_timer(fns: list[Callable[[], Any]], backend: Backend, device: torch.device) -> list[list[float]]:
    return interleave.time_rounds(fns, backend, device, CHECK_ROUNDS)


timer: Timer = _device_timer

_lock = threading.Lock()
_verdicts: dict[str, dict[str, Any]] = {}  # check key -> verdict, this process
_running: dict[str, threading.Event] = {}  # check keys whose check runs now
_disk: dict[Path, tuple[float, dict[str, Any]]] = {}  # path -> (mtime, verdicts)
checks_run = 0  # first-use checks this process has run (tests, diagnostics)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    """What a verdict is only valid for: torch, its CUDA (or HIP), Triton and xkernels versions."""
    return {"torch": torch.__version__, "cuda": torch.version.cuda or torch.version.hip,
            "triton": _version("triton") or _version("triton-ascend"), "xkernels": _version("xkernels")}


def _m_bucket(m: int) -> list[int]:
    lo = 1 << max(0, int(m).bit_length() - 1) if m > 0 else 0
    return [lo, max(lo * 2 - 1, 0)]


def check_key(op: str, backend: Backend, device: torch.device, key: dict[str, Any], tma: Any,
              precision: str) -> dict[str, Any]:
    """The first-use check's key (see the module doc): a verdict is reused only where all of it matches."""
    try:
        name = backend.properties(device).name
    except Exception:  # noqa: BLE001 - an odd device's properties must not fail a call
        name = "?"
    return {"op": op, "backend": backend.name, "arch": backend.arch(device), "device": name,
            "versions": versions(), "dtype": key["dtype"], "m": _m_bucket(key["m"]), "n": key["n"], "k": key["k"],
            "batch": key["batch"], "activation": key["activation"], "bias": key["bias"], "a_layout": key["a_layout"],
            "tma": list(tma) if tma else None, "precision": precision, "rule": VERDICT_RULE}


def _ident(ck: dict[str, Any]) -> str:
    return json.dumps(ck, sort_keys=True)


def _path(backend: str, op: str) -> Path:
    return tuning.cache_dir(backend) / "first_use" / f"{op}.json"


def _disk_verdicts(path: Path) -> dict[str, Any]:
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return {}
    hit = _disk.get(path)
    if hit is None or hit[0] != mtime:
        try:
            hit = (mtime, dict(json.loads(path.read_text()).get("verdicts", {})))
        except (OSError, ValueError, AttributeError):
            hit = (mtime, {})  # an unreadable cache is a cache miss; the next write replaces it
        _disk[path] = hit
    return hit[1]


def verdict(ck: dict[str, Any]) -> dict[str, Any] | None:
    """The verdict for check key ``ck``: this process's, else the disk cache's."""
    ident = _ident(ck)
    with _lock:
        v = _verdicts.get(ident)
    if v is None:
        v = _disk_verdicts(_path(ck["backend"], ck["op"])).get(ident)
        if v is not None:
            with _lock:
                _verdicts.setdefault(ident, v)
    return v


def _store(ck: dict[str, Any], v: dict[str, Any]) -> None:
    path = _path(ck["backend"], ck["op"])
    with tuning.locked(path):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data["source"] = ("xkernels first-use checks (ops/matmul/evidence.py): kernel vs BLAS timed on this "
                          "machine; each key holds the device and the versions it is valid for")
        data.setdefault("verdicts", {})[_ident(ck)] = v
        tuning.write_json_atomic(path, data)


def launch_bound(blas_ms: float | None, backend: Backend) -> float | None:
    """The BLAS route's host cost (``Backend.route_host_ms``) where a measured BLAS device time
    ``blas_ms`` is under it (the call is launch-bound), else ``None``."""
    host = host_ms(backend, {"VENDOR": True})
    return host if blas_ms is not None and 0 < blas_ms < host else None


def device_floor(blas_ms: float | None, backend: Backend, floor: float) -> float:
    """The device ratio (BLAS / kernel) evidence must show: ``floor``, or
    :data:`LAUNCH_BOUND_MARGIN` where the measured BLAS time is launch-bound."""
    return max(floor, LAUNCH_BOUND_MARGIN) if launch_bound(blas_ms, backend) is not None else floor


def _under_host(blas_ms: float, host: float) -> str:
    return f"the BLAS's {blas_ms * 1e3:.1f} us under its route's {host * 1e3:.1f} us host cost"


def describe(v: dict[str, Any]) -> str:
    """A verdict in one phrase, for ``explain()``."""
    winner = "kernel" if v["winner"] == "kernel" else "BLAS"
    if "error" in v:
        return f"first-use check on this device: the kernel failed ({v['error']}) -> BLAS"
    bound = ""
    wall = v.get("wall_ratio", v["ratio"])
    blas_host = v.get("blas_host_ms")
    if abs(wall - v["ratio"]) > 1e-9:
        host = "" if blas_host is None else f"{blas_host * 1e3:.1f} us for the BLAS, "
        bound = f"; per call with the routes' host costs ({host}route_host_ms): {wall:.2f}x"
    floor = v.get("device_floor", DEVICE_FLOOR)
    why = f", as launch-bound: {_under_host(v['blas_ms'], blas_host)}" if v.get("launch_bound") and blas_host else ""
    return (f"first-use check on this device (M={v['m']}, {v['rounds']} interleaved rounds): kernel "
            f"{v['kernel_ms'] * 1e3:.1f} us vs BLAS {v['blas_ms'] * 1e3:.1f} us, {v['ratio']:.2f}x{bound} "
            f"(needs {CHECK_MARGIN:g}x per call and {floor:g}x on the device{why}) -> {winner}")


def verdict_record(v: dict[str, Any]) -> dict[str, Any]:
    """What a kernel's winning first-use verdict measured, as a selection's ``record``: its device
    ratio over the BLAS route (``F.linear`` + PyTorch's activation, the quantity a table rule's
    ``worst_ratio`` holds) under ``"first_use_ratio"``; empty for a launch-bound call, whose
    few-microsecond timings move by ~10% between the check and later runs (:data:`LAUNCH_BOUND_MARGIN`)."""
    if v.get("winner") != "kernel" or "error" in v or v.get("launch_bound"):
        return {}
    return {"first_use_ratio": float(v["ratio"]), "m": v["m"], "rounds": v["rounds"]}


def measured_ratio(sel: Selection) -> float | None:
    """The kernel's measured speedup over the BLAS route behind a selection: its table rule's
    ``worst_ratio``, or its first-use verdict's device ratio (:func:`verdict_record`); ``None``
    where nothing measured it (the wave model, neighbours, the BLAS)."""
    ratio = sel.record.get("worst_ratio") if sel.measured else sel.record.get("first_use_ratio")
    return float(ratio) if isinstance(ratio, int | float) else None


# -- neighbours ---------------------------------------------------------------------------------
def _rule_for(op: str, backend: Backend, arch: str, key: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The first table rule matching ``key`` (``tuning.lookup``'s order) and where it is."""
    for path, arch_key, table in tuning._tables(op, backend, arch):
        for i, rule in enumerate(table["archs"].get(arch_key, ())):
            if tuning.matches(rule.get("when", {}), key):
                return rule, f"{path.name} [{arch_key}] rule {i}"
    return None


def _shape_mnk(shape: Any) -> tuple[int, int, int] | None:
    """(M, N, K) of a ``"measured"`` shape: ``[M, N, K]`` (sweeps) or ``[[M, K], [K, N], ...]`` (autotune)."""
    if isinstance(shape, list) and len(shape) == 3 and all(isinstance(v, int) for v in shape):
        return shape[0], shape[1], shape[2]
    if (isinstance(shape, list) and len(shape) >= 2 and all(isinstance(s, list) and len(s) == 2 for s in shape[:2])
            and shape[0][1] == shape[1][0]):
        return shape[0][0], shape[1][1], shape[0][1]
    return None


def neighbours(op: str, backend: Backend, device: torch.device, key: dict[str, Any], ck: dict[str, Any],
               tma: Any) -> list[dict[str, Any]]:
    """The call's neighbours (see the module doc): ``[{"m", "ratio", "config", "from"}]``."""
    m = key["m"]
    lo, hi = m / NEIGHBOUR_M_FACTOR, m * NEIGHBOUR_M_FACTOR
    arch = backend.arch(device)
    ms: set[int] = set()
    for _, arch_key, table in tuning._tables(op, backend, arch):
        for rule in table["archs"].get(arch_key, ()):
            for shape in (rule.get("measured") or {}).get("shapes", ()):
                mnk = _shape_mnk(shape)
                if mnk and mnk[1] == key["n"] and mnk[2] == key["k"] and lo <= mnk[0] <= hi:
                    ms.add(mnk[0])
    out = []
    lookup_key = {**key, "variant": "tma"} if tma else key
    for mp in sorted(ms):
        found = _rule_for(op, backend, arch, {**lookup_key, "m": mp})
        if found is None or "measured" not in found[0]:
            continue
        rule, where = found
        rec = rule["measured"]
        if rule["config"].get("VENDOR"):
            ratio = min(1.0, float(rec.get("best_kernel_ratio", 1.0)))
        else:
            ratio = float(rec.get("worst_ratio") or rec["torch_ms"] / rec["ms"])
        out.append({"m": mp, "ratio": ratio, "config": rule["config"], "from": where})
    same = {k: v for k, v in ck.items() if k != "m"}
    with _lock:
        mine = [(json.loads(i), v) for i, v in _verdicts.items()]
    for other, v in mine:
        if ({k: x for k, x in other.items() if k != "m"} == same and lo <= v["m"] <= hi and "error" not in v
                and other["m"] != ck["m"]):
            out.append({"m": v["m"], "ratio": v["ratio"], "config": v["config"], "from": "a first-use check"})
    return sorted(out, key=lambda p: p["m"])


def agreeing(points: list[dict[str, Any]], m: int) -> dict[str, Any] | None:
    """The nearest neighbour's point where the neighbours agree (see the module doc), else ``None``."""
    if not points or not any(p["m"] <= m for p in points) or not any(p["m"] >= m for p in points):
        return None
    if any(p["ratio"] < NEIGHBOUR_MARGIN or p["config"].get("VENDOR") for p in points):
        return None
    return min(points, key=lambda p: (abs(math.log(p["m"] / m)), p["m"]))


# -- the gate -----------------------------------------------------------------------------------
#: how much of a measured shape's tile-and-wave fill a call may lose before the rule's measurement
#: no longer speaks for it (a 256-row tile measured at M = 512 fills 65% at M = 333: 0.58x there)
FILL_MARGIN = 0.9
#: how far in M a rule's measurement speaks for a call that runs another number of waves of the
#: rule's tiles: as M grows the BLAS fills the device better and a kernel's margin can turn (H100,
#: bf16, 768 -> 3072 + gelu: a 128x64 tile measured 1.13x at M = 512 ran 0.91x at M = 1024)
MEASURED_M_FACTOR = 1.5
#: from this many waves on, a kernel's ratio to the BLAS hardly moves with M (quantization has
#: washed out): a rule measured there speaks for any M that runs as many (H100 public corpus,
#: 2026-11-25: gpt2.lm_head's rule measured at 2048 tokens held 4.4-4.9x at 8192 and 12608,
#: llama3-8b.qkv's measured at 8192 held 1.05x at 12608; results/2026-11-25-h100-selection-m-range)
STEADY_WAVES = 8


def fill(cfg: dict[str, Any], shape: Shape, units: int) -> float:
    """The share of the launched tiles' area the problem fills: M x N x batch over the tiles'
    area, rounded up to whole waves of ``units`` programs (tile and wave quantization)."""
    bm, bn, _ = effective_blocks(cfg, shape)
    _, n_waves = waves(cfg, shape, units)  # a persistent kernel's last loop is as partial as a last wave
    return shape.batch * shape.m * shape.n / (n_waves * units * bm * bn)


def uncovered(sel: Selection, shape: Shape, backend: Backend, device: torch.device) -> str | None:
    """Why a measured rule's measurement does not cover this call, or ``None``: of the measured
    shapes with the call's N and K, none fills its tiles alike (the call's tile and wave fill is
    below ``FILL_MARGIN`` of the best measured shape's), or none lies within ``MEASURED_M_FACTOR``
    of the call's M, runs the same number of waves as the call, or runs ``STEADY_WAVES`` or more
    as the call does."""
    shapes = [s for s in sel.record.get("shapes") or () if len(s) == 3 and s[1] == shape.n and s[2] == shape.k]
    if not shapes:
        return None  # a class rule measured on other N/K (or with no shapes recorded): the table's word
    units = backend.compute_units(device) or 1
    measured = [Shape(m, n, k, shape.batch, shape.element_size, shape.split_ok) for m, n, k in shapes]
    ms = ", ".join(f"M={s.m}" for s in measured)
    mine = fill(sel.config, shape, units)
    best = max(fill(sel.config, s, units) for s in measured)
    if mine < FILL_MARGIN * best:
        return f"{ms}, where its tiles fill {best:.0%} of the launch; at M={shape.m} they fill {mine:.0%}"
    my_waves = waves(sel.config, shape, units)[1]
    if any(max(s.m, shape.m) <= MEASURED_M_FACTOR * min(s.m, shape.m) or waves(sel.config, s, units)[1] == my_waves
           or min(waves(sel.config, s, units)[1], my_waves) >= STEADY_WAVES for s in measured):
        return None
    runs = ", ".join(str(waves(sel.config, s, units)[1]) for s in measured)
    return (f"{ms} ({runs} waves of its tiles); M={shape.m} runs {my_waves}, more than "
            f"{MEASURED_M_FACTOR:g}x from a measured M")


def rule_ratio(record: dict[str, Any]) -> float | None:
    """A measured rule's BLAS time over its kernel's (its worst over the shapes it measured), or
    ``None`` where the record holds neither."""
    r = record.get("worst_ratio")
    if r is None and record.get("ms") and record.get("torch_ms"):
        r = record["torch_ms"] / record["ms"]
    return None if r is None else float(r)


def rule_blas_ms(record: dict[str, Any]) -> float | None:
    """The BLAS's device time a measured rule recorded (the shortest, where it measured several
    shapes), or ``None``."""
    t = record.get("torch_ms")
    if isinstance(t, list):
        t = min((float(x) for x in t if isinstance(x, (int, float))), default=None)
    return float(t) if isinstance(t, (int, float)) and t > 0 else None


def rule_refusal(record: dict[str, Any], backend: Backend) -> str | None:
    """Why a measured rule's kernel may not run (it measured slower than the BLAS, or too thin a
    margin for a launch-bound call: :func:`device_floor`), for ``explain()``; ``None`` where it may."""
    ratio = rule_ratio(record)
    if ratio is None:
        return None
    if ratio < RULE_FLOOR:
        return f"where its kernel measured {ratio:.2f}x the BLAS: BLAS"
    blas = rule_blas_ms(record)
    if ratio < device_floor(blas, backend, RULE_FLOOR):
        return (f"where its kernel measured {ratio:.2f}x the BLAS in a launch-bound call "
                f"({_under_host(blas, launch_bound(blas, backend))}; needs {LAUNCH_BOUND_MARGIN:g}x): BLAS")
    return None


def gate(op: str, backend: Backend, device: torch.device, key: dict[str, Any], shape: Shape, tma: Any,
         sel: Selection, precision: str) -> Selection:
    """``sel`` where it needs no evidence (a measured rule, the BLAS, a backend without a BLAS
    alternative); else the kernel the evidence supports, or the BLAS with ``pending`` set."""
    if (sel.config.get("VENDOR") or not backend.kernel_needs_evidence
            or tuning.forced_config() is not None):
        return sel  # a forced config (a sweep, a test) runs as forced: the caller is the evidence
    if sel.measured:
        refused = rule_refusal(sel.record, backend)
        if refused is not None:
            return Selection({"VENDOR": True}, sel.source, f"{sel.why}, {refused}", True, sel.estimates_ms,
                             record=sel.record)
        gap = uncovered(sel, shape, backend, device)
        if gap is None:
            return sel
        # the rule's measurement does not speak for this call's tile and wave fill: evidence as for
        # any unmeasured shape, with the rule's kernel as the candidate
        sel = Selection(dict(sel.config), sel.source, f"{sel.why}, measured at {gap}", False, sel.estimates_ms)
    ck = check_key(op, backend, device, key, tma, precision)
    v = verdict(ck)
    if v is not None:
        text = describe(v)
        if v["winner"] == "kernel":
            return Selection(dict(v["config"]), sel.source, text, False, sel.estimates_ms, record=verdict_record(v))
        return Selection({"VENDOR": True}, sel.source, text, False, sel.estimates_ms)
    points = neighbours(op, backend, device, key, ck, tma)
    near = agreeing(points, shape.m)
    listed = ", ".join(f"M={p['m']} {p['ratio']:.2f}x" for p in points)
    if near is not None:
        return Selection(dict(near["config"]), sel.source,
                         f"neighbours ({listed}; same N, K, dtype, epilogue) measured the kernel at least "
                         f"{NEIGHBOUR_MARGIN:g}x faster than the BLAS: the config of M={near['m']} ({near['from']})",
                         False, sel.estimates_ms)
    seen = f"; neighbours that do not agree: {listed}" if points else ""
    return Selection({"VENDOR": True}, sel.source,
                     f"no evidence: BLAS (a first-use check on the device may settle it{seen}; the wave model's "
                     f"pick: {_label(sel.config)}: {sel.why})", False, sel.estimates_ms, pending=(ck, sel))


# -- the first-use check ------------------------------------------------------------------------
def cannot_check(device: torch.device) -> str | None:
    """Why no first-use check may run now, or ``None``."""
    if not tuning.first_use_check_enabled():
        return "the first-use check is off"
    try:
        if torch.compiler.is_compiling():
            return "torch.compile is tracing"
    except AttributeError:  # torch < 2.3
        pass
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured"
    return None


def first_use(call: Any, backend: Backend, plan: Any, make: Callable[[Any, Selection], Any],
              run: Callable[[Any, Any], Any]) -> Any:
    """Settle a ``pending`` plan (the BLAS for want of evidence) by a first-use check where one
    may run: the plan of the verdict's winner; ``plan`` itself where none may run.
    ``make(call, selection)`` builds a plan, ``run(plan, call)`` runs one."""
    ck, kernel_sel = plan.selection.pending
    if cannot_check(call.device) is not None:
        return plan
    ident = _ident(ck)
    with _lock:
        v = _verdicts.get(ident)
        wait = _running.get(ident) if v is None else None
        mine = v is None and wait is None
        if mine:
            done = _running[ident] = threading.Event()
    if wait is not None:
        wait.wait()
        v = verdict(ck)
    elif mine:
        try:
            v = verdict(ck) or _check(ck, call, backend, plan, kernel_sel, make, run)
        finally:
            with _lock:
                if v is not None:
                    _verdicts[ident] = v
                _running.pop(ident, None)
            done.set()
    if v is None:
        return plan
    text = describe(v)
    if v["winner"] == "kernel":
        return make(call, Selection(dict(v["config"]), kernel_sel.source, text, False, kernel_sel.estimates_ms,
                                    record=verdict_record(v)))
    return make(call, Selection({"VENDOR": True}, kernel_sel.source, text, False, kernel_sel.estimates_ms))


def _check(ck: dict[str, Any], call: Any, backend: Backend, blas_plan: Any, kernel_sel: Selection,
           make: Callable[[Any, Selection], Any], run: Callable[[Any, Any], Any]) -> dict[str, Any]:
    global checks_run
    trial = dataclasses.replace(call, out=None)  # fresh outputs: the user's out= is never touched
    m = int(call.a.shape[-2])
    base = {"m": m, "config": kernel_sel.config, "rounds": 0,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
    try:
        kernel_plan = make(trial, Selection(kernel_sel.config, kernel_sel.source, kernel_sel.why, False))
        times = timer([lambda: run(kernel_plan, trial), lambda: run(blas_plan, trial)], backend, call.device)
    except Exception as exc:  # noqa: BLE001 - said aloud, and the call runs the BLAS
        err = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
        warnings.warn(f"xkernels: first-use check of {ck['op']} {ck['dtype']} M={m} N={ck['n']} K={ck['k']}: the "
                      f"kernel {_label(kernel_sel.config)} failed ({err}); this bucket runs the BLAS",
                      RuntimeWarning, stacklevel=6)
        with _lock:
            checks_run += 1
        return {**base, "winner": "blas", "error": err, "kernel_ms": math.nan, "blas_ms": math.nan, "ratio": 0.0}
    s = interleave.summary(times)
    # a call costs its device time or its route's host cost, whichever is larger (route_host_ms);
    # where the BLAS's device time is launch-bound, the device must show LAUNCH_BOUND_MARGIN as well:
    # a cheaper host route does not buy a kernel whose device time may lose to the BLAS
    blas_host = host_ms(backend, {"VENDOR": True})
    kernel_wall = max(s["ms"][0], host_ms(backend, kernel_sel.config))
    blas_wall = max(s["ms"][1], blas_host)
    wall_ratio = blas_wall / kernel_wall if kernel_wall > 0 else 0.0
    floor = device_floor(s["ms"][1], backend, DEVICE_FLOOR)  # LAUNCH_BOUND_MARGIN for a launch-bound BLAS
    wins = wall_ratio >= CHECK_MARGIN and s["ratio"] >= floor
    v = {**base, "rounds": s["rounds"], "kernel_ms": s["ms"][0], "blas_ms": s["ms"][1], "ratio": s["ratio"],
         "spread": s["spread"], "wall_ratio": wall_ratio, "blas_host_ms": blas_host, "device_floor": floor,
         "launch_bound": launch_bound(s["ms"][1], backend) is not None, "winner": "kernel" if wins else "blas"}
    with _lock:
        checks_run += 1
    try:
        _store(ck, v)
    except OSError as exc:  # an unwritable cache: the verdict holds for this process, said once
        warnings.warn(f"xkernels: could not write the first-use cache ({exc}); the verdict holds for this process",
                      RuntimeWarning, stacklevel=6)
    return v


def forget() -> None:
    """Drop this process's verdicts (tests; the disk cache stays)."""
    global checks_run
    with _lock:
        _verdicts.clear()
        _disk.clear()
        checks_run = 0
