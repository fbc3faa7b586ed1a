"""A tuning sweep's work: which (case x config) items to measure, measuring them, checkpoints.

* **Plan** (:func:`plan`): the cases of a shape set (``models``: the real-model corpus of
  ``xkernels.harness.models``; ``seed``: one representative shape per size class; ``quick``: a few
  small shapes, for CI under the interpreter), each with the candidate configs of the op's tuning
  tables (``"candidates"`` sections, :func:`xkernels.tuning.candidates`; the element-wise ops fall
  back to :data:`ELEMENTWISE_CANDIDATES` where a table has none). An item is one (case, config).
* **Measure** (:func:`measure_case`): each config runs under ``tuning.force``, is checked against
  the float64 PyTorch reference with the harness tolerances (inputs checked unchanged), then timed
  by a :data:`Timer` (by default the harness timer: each call alone behind a cache flush). A config
  that fails to compile, run or match is recorded with its error; one that does not apply to the
  call (a TMA config where the call cannot load through tensor descriptors, an element-wise config
  of the other kernel variant) is recorded as not applicable. Nothing is dropped silently.
* **Checkpoints** (:class:`Checkpoint`): every record is appended to
  ``<out-dir>/checkpoints/<op>.rank<R>.jsonl`` as it is made; a restarted sweep reads every
  checkpoint of the op and measures only what is missing.
* **Rows** (:func:`rows`): a case's records become one line of the measurement file that
  ``xkernels.cli.matmul_tables`` (matmul/linear) and ``python -m xkernels.tune`` (element-wise) read.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xkernels import interleave, tuning
from xkernels.backend import Backend
from xkernels.harness import Target, tolerances
from xkernels.harness.accuracy import op_function, reference
from xkernels.harness.cases import OPS, Case, T, cases, expected_result
from xkernels.harness.perf import Settings, confirm, time_calls
from xkernels.sweep_timing import Phases

SHAPE_SETS = ("models", "seed", "quick")
CHECK_CHUNK = 1 << 24
MATMUL_OPS = ("matmul", "linear")

#: Timing of one candidate: each call alone, behind a cache-flushing write, timed by the
#: backend's events (``harness.perf.time_calls``), so host dispatch never enters the figure.
SWEEP = Settings(warmup=3, warmup_s=0.05, min_reps=10, max_reps=60, budget_s=0.15, flush=True)

#: ``timer(fn, label) -> ms``: device milliseconds of one call of ``fn``; ``label`` says what runs
#: (``{"case": id, "who": "torch" | "xkernels", "cfg": config}``). Tests inject a fixed one.
Timer = Callable[[Callable[[], Any], dict[str, Any]], float]
#: ``confirm(kernel_fn, torch_fn, label) -> {"ms": [kernel, torch], "ratio": torch / kernel per round,
#: median, "spread": [p20, p80], "rounds"}`` (label: case, cfg, and "ms", torch's time): re-measures a
#: case whose best config would lose to PyTorch, in interleaved rounds, before the tables act on it
#: (``harness.perf.confirm``).
Confirm = Callable[[Callable[[], Any], Callable[[], Any], dict[str, Any]], dict[str, Any]]
#: Interleaved (kernel, torch) rounds that confirm a loss.
CONFIRM_ROUNDS = 7


def confirm_for(target: Target, timer: Timer | None = None, rounds: int = CONFIRM_ROUNDS) -> Confirm:
    """The device's interleaved rounds (``harness.perf.confirm``); with an injected ``timer``
    (tests), rounds of (``timer(kernel)``, ``timer(torch)``) in turn."""
    if timer is None:
        # a short call (label's "ms": torch's time) is confirmed as replays (interleave.REPLAY_BELOW_MS)
        return lambda fn, torch_fn, label: confirm(fn, torch_fn, target, rounds, call_ms=label.get("ms"))

    def by_timer(fn: Callable[[], Any], torch_fn: Callable[[], Any], label: dict[str, Any]) -> dict[str, Any]:
        times = [[timer(fn, {**label, "who": "xkernels"}), timer(torch_fn, {**label, "who": "torch"})]
                 for _ in range(rounds)]
        return interleave.summary(times)

    return by_timer

#: Element-wise candidates where a table has no ``"candidates"`` section (cuda-shaped: row tiles
#: of up to 32 Ki elements, flat blocks of 1-16 Ki, 4-16 warps).
ELEMENTWISE_CANDIDATES: dict[str, list[dict[str, Any]]] = {
    "tiled": [{"BLOCK_M": m, "BLOCK_N": n, "num_warps": w}
              for m, n, w in itertools.product([1, 2, 4, 8, 16, 32], [256, 512, 1024, 2048], [4, 8]) if m * n <= 32768],
    "flat": [{"BLOCK": b, "num_warps": w} for b, w in itertools.product([1024, 2048, 4096, 8192, 16384], [4, 8, 16])],
}

#: Element-wise size classes (numel ranges) and the (rows, cols) representing each in ``seed``:
#: tiny (launch-bound), small, L2-resident, HBM-bound.
NUMEL_CLASSES = ((0, 2**17, (256, 256)), (2**17 + 1, 2**20, (512, 1024)), (2**20 + 1, 2**24 - 1, (2048, 4096)),
                 (2**24, 2**62, (8192, 8192)))
#: (M, K, N) of the ``seed`` matmul/linear shapes: few rows, short and mid K, square.
MATMUL_SEED = {"bfloat16": [(16, 4096, 4096), (64, 4096, 4096), (4096, 256, 4096), (4096, 1024, 4096),
                            (2048, 2048, 2048), (4096, 4096, 4096)],
               "float32": [(64, 4096, 4096), (4096, 4096, 4096)]}


def timer_for(target: Target, reps: int = 0) -> Timer:
    """The harness timer (``reps``: a fixed number of timed calls, 0 = a time budget)."""
    settings = SWEEP if not reps else Settings(**{**SWEEP.__dict__, "min_reps": reps, "max_reps": reps})
    return lambda fn, label: time_calls(lambda _: fn(), [None], target, settings).median_ms


# -- plan ---------------------------------------------------------------------------------------
def dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def elementwise_variant(case: Case) -> str:
    """``"flat"`` for a same-shape, same-dtype add of contiguous tensors, else ``"tiled"``."""
    ts = [a for a in case.args if isinstance(a, T)]
    same = len(ts) == len(case.args) == 2 and ts[0].shape == ts[1].shape and ts[0].dtype == ts[1].dtype
    return "flat" if same and all(t.view == "contiguous" for t in ts) else "tiled"


def _shape_cases(op: str, shapes: str, dtypes: list[torch.dtype] | None, models: list[str] | None) -> list[Case]:
    if shapes == "models":
        return cases([op], dtypes or [torch.float16, torch.bfloat16, torch.float32], ["models"], models)
    if models:
        raise ValueError(f"--model picks cases of the real-model corpus: it needs --shapes models, not {shapes!r}")
    tag = frozenset({shapes})
    out = []
    if shapes == "seed":
        for d in dtypes or [torch.bfloat16, torch.float32]:
            if op in MATMUL_OPS:
                for m, k, n in MATMUL_SEED["float32" if d == torch.float32 else "bfloat16"]:
                    out.append(_gemm_case(op, m, k, n, d, tag))
            else:
                for _, _, (rows, cols) in NUMEL_CLASSES:
                    out.append(Case(op, (T((rows, cols), d), T((cols,), d)), "bias[N]", tag))
                    if op == "add":
                        out.append(Case(op, (T((rows, cols), d), T((rows, cols), d)), "same shape", tag))
        return out
    if shapes != "quick":
        raise ValueError(f"unknown shape set {shapes!r}; known: {', '.join(SHAPE_SETS)}")
    for d in dtypes or [torch.float32]:
        if op in MATMUL_OPS:
            out += [_gemm_case(op, m, k, n, d, tag) for m, k, n in ((8, 64, 32), (32, 64, 32), (64, 32, 32))]
        else:
            out.append(Case(op, (T((16, 256), d), T((256,), d)), "bias[N]", tag))
            if op == "add":
                out.append(Case(op, (T((16, 256), d), T((16, 256), d)), "same shape", tag))
    return out


def _gemm_case(op: str, m: int, k: int, n: int, d: torch.dtype, tag: frozenset[str]) -> Case:
    if op == "linear":  # x (M, K), weight (N, K): B is K-contiguous; bias + gelu epilogue
        return Case(op, (T((m, k), d), T((n, k), d), T((n,), d), "gelu"), "bias + gelu", tag)
    return Case(op, (T((m, k), d), T((k, n), d)), "2-D", tag)


@dataclass(frozen=True)
class SweepCase:
    """One case of a sweep and the candidate configs it is measured with."""

    case: Case
    configs: tuple[dict[str, Any], ...]
    candidates_from: str

    @property
    def id(self) -> str:
        return self.case.id

    def item_ids(self) -> list[str]:
        return [item_id(self.id, c) for c in self.configs]

    def cost(self) -> float:
        """Estimated relative time: per config a fixed part (compile, warm-up) plus the work."""
        elements = sum(math.prod(s) for s in self.case.shapes if isinstance(s, tuple))
        flops = 2 * math.prod(self.case.shapes[0]) * self.case.shapes[1][0] if self.case.op == "linear" else 0
        if self.case.op == "matmul":
            flops = 2 * math.prod(self.case.shapes[0]) * self.case.shapes[1][-1]
        return len(self.configs) * (1.0 + elements / 1e9 + flops / 1e13)


def item_id(case_id: str, cfg: dict[str, Any]) -> str:
    return f"{case_id}|{json.dumps(cfg, sort_keys=True)}"


def candidate_key(case: Case) -> dict[str, Any]:
    """The key the op's candidate groups are matched with (dtype; variant for element-wise)."""
    key: dict[str, Any] = {"dtype": dtype_name(case.dtype)}
    if case.op not in MATMUL_OPS:
        key["variant"] = elementwise_variant(case)
    return key


def plan(op: str, backend: Backend, shapes: str, dtypes: list[torch.dtype] | None = None,
         models: list[str] | None = None) -> list[SweepCase]:
    """The cases of shape set ``shapes`` for ``op`` with their candidate configs on ``backend``."""
    arch = backend.arch()
    out = []
    for case in _shape_cases(op, shapes, dtypes, models):
        key = candidate_key(case)
        configs, source = tuning.candidates(op, backend, arch, key)
        configs = [{k: v for k, v in c.items() if k != "cost"} for c in configs]
        if op not in MATMUL_OPS and not configs:
            configs, source = ELEMENTWISE_CANDIDATES[key["variant"]], "xkernels.sweep.ELEMENTWISE_CANDIDATES"
        if not configs:
            raise ValueError(f"no candidate configs for {op} {key} on backend {backend.name!r} (arch {arch!r}): "
                             f"add a \"candidates\" section to its table")
        unique = list({json.dumps(c, sort_keys=True): c for c in configs}.values())
        out.append(SweepCase(case, tuple(unique), source))
    return out


def assign(sweep: list[SweepCase], world_size: int) -> list[list[int]]:
    """Case indices per rank: longest estimated case first, each to the least loaded rank
    (deterministic, so every rank computes the same split)."""
    load = [0.0] * world_size
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(sweep)), key=lambda i: (-sweep[i].cost(), i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        ranks[r].append(i)
        load[r] += sweep[i].cost()
    return [sorted(r) for r in ranks]


# -- checkpoints --------------------------------------------------------------------------------
class Checkpoint:
    """Append-only JSONL of one rank's records; :meth:`load` reads every rank's (a line cut
    short by a crash is ignored). Records of another backend or arch are never reused."""

    def __init__(self, out_dir: Path, op: str, rank: int, backend: str, arch: str) -> None:
        self.dir = Path(out_dir) / "checkpoints"
        self.path = self.dir / f"{op}.rank{rank}.jsonl"
        self.op, self.backend, self.arch = op, backend, arch

    def load(self) -> dict[str, dict[str, Any]]:
        """Earlier records by key (an item id, or ``"torch|<case id>"``)."""
        done: dict[str, dict[str, Any]] = {}
        for path in sorted(self.dir.glob(f"{self.op}.rank*.jsonl")):
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("backend") == self.backend and rec.get("arch") == self.arch and "key" in rec:
                    done[rec["key"]] = rec
        return done

    def append(self, rec: dict[str, Any]) -> dict[str, Any]:
        """Append ``rec`` (on a line of its own: after a line a crash cut short, a new line)."""
        rec = {**rec, "backend": self.backend, "arch": self.arch}
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as f:
            cut = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
            f.write((b"\n" if cut else b"") + json.dumps(rec).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        return rec


# -- measure ------------------------------------------------------------------------------------
class NotApplicable(Exception):
    """The config does not apply to this call (its kernel variant is not the call's)."""


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


def _check(op: str, got: Any, ref: torch.Tensor, mag: torch.Tensor | None, tol: tolerances.Tolerance,
           dot: float) -> None:
    """Raise ValueError unless ``got`` matches the float64 reference within the tolerance."""
    if not isinstance(got, torch.Tensor) or got.shape != ref.shape:
        raise ValueError(f"returned {getattr(got, 'shape', type(got).__name__)}, expected {tuple(ref.shape)}")
    bad = 0
    flat_g, flat_r = got.reshape(-1), ref.reshape(-1)
    flat_m = None if mag is None else mag.reshape(-1)
    for lo in range(0, flat_g.numel(), CHECK_CHUNK):  # chunks: a 12608 x 50257 result needs no 5 GB temporaries
        g = flat_g[lo:lo + CHECK_CHUNK].to(ref.dtype)
        want = flat_r[lo:lo + CHECK_CHUNK].to(got.dtype).to(ref.dtype)  # the reference rounded to the result dtype
        allowed = tol.atol + tol.rtol * want.abs()
        if flat_m is not None:
            allowed = allowed + dot * flat_m[lo:lo + CHECK_CHUNK]
        bad += int((~((g - want).abs() <= allowed) & ~(g == want)).sum())
    if bad:
        raise ValueError(f"{bad} of {got.numel()} elements outside the tolerance ({tol.source[:60]}...)")


def rotated(configs: tuple[dict[str, Any], ...], rank: int, size: int) -> list[dict[str, Any]]:
    """``configs`` in the order rank ``rank`` of ``size`` measures them: starting ``rank / size``
    of the way in. Ranks on one host share the Triton cache: started on the same kernels they
    would compile each one ``size`` times at once; staggered, each compiles its own part of the
    list first and later finds the others' parts in the cache."""
    start = rank * len(configs) // max(size, 1)
    return list(configs[start:]) + list(configs[:start])


def measure_case(sc: SweepCase, target: Target, timer: Timer, done: dict[str, dict[str, Any]],
                 record: Callable[[dict[str, Any]], dict[str, Any]], seed: int = 0,
                 on_item: Callable[[dict[str, Any]], None] | None = None, phases: Phases | None = None,
                 order: tuple[int, int] = (0, 1), confirm_loss: Confirm | None = None) -> list[dict[str, Any]]:
    """Measure every config of ``sc`` not in ``done``; ``record`` stores each new record (a
    checkpoint); returns the case's records (reused and new; torch's first, then the configs in
    ``sc.configs`` order, then a ``confirm|<case>`` record where there is one). ``order`` = (rank,
    world size): the order they are measured in (:func:`rotated`); ``phases`` accumulates where the
    time goes (``xkernels.sweep_timing``). ``confirm_loss``: where the fastest config of a
    matmul/linear case is slower than torch, the two are re-measured in interleaved rounds (the
    ``confirm|<case>`` record), which the tables act on."""
    phases = phases or Phases()
    case = sc.case
    todo = [c for c in sc.configs if item_id(sc.id, c) not in done]
    torch_key, confirm_key = f"torch|{sc.id}", f"confirm|{sc.id}"
    if not todo and torch_key in done and (confirm_loss is None or not _loses(sc, done) or confirm_key in done):
        return [done[torch_key]] + [done[i] for i in sc.item_ids()] + ([done[confirm_key]] if confirm_key in done
                                                                         else [])
    backend, device = target.backend, target.device
    fn, torch_fn = op_function(case.op), OPS[case.op].torch_fn
    with phases("inputs_s"):
        inputs = case.make_inputs(device, seed)
        args, kwargs = inputs.args, inputs.kwargs
        expected = expected_result(case.op, inputs)
        wide_on = device if device.type in ("cpu", "cuda") else "cpu"  # float64 where the device has it
        ref, mag, k = reference(case.op, inputs, expected.dtype, on=wide_on)
    tol = tolerances.tolerance(case.op, expected.dtype, backend)
    act = next((a for a in args[3:] if isinstance(a, str)), None) if case.op == "linear" else None
    dot = tol.dot_coefficient(k, act) if mag is not None else 0.0
    saved = {i: a.clone() for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    variant = elementwise_variant(case) if case.op not in MATMUL_OPS else None
    if torch_key in done:
        torch_rec = done[torch_key]
    else:
        t0 = time.perf_counter()
        with phases("timing_s"):
            ms = timer(lambda: torch_fn(*args, **kwargs), {"case": sc.id, "who": "torch"})
        phases.add("torch_timing_s", time.perf_counter() - t0)
        torch_rec = record({"key": torch_key, "case": sc.id, "torch_ms": ms})
    by_id: dict[str, dict[str, Any]] = {}
    for cfg in rotated(sc.configs, *order):
        iid = item_id(sc.id, cfg)
        if iid in done:
            by_id[iid] = done[iid]
            continue
        rec: dict[str, Any] = {"key": iid, "case": sc.id, "cfg": cfg}
        first = time.perf_counter()
        try:
            from xkernels.dispatch import use_backend

            with use_backend(backend.name), tuning.force(cfg), phases.compiles():
                expl = fn.explain(*args, **kwargs)
                if cfg.get("TMA") and not expl.config.get("TMA"):
                    raise NotApplicable("the call cannot load its operands through tensor descriptors")
                if variant is not None:
                    wants = "flat" if "BLOCK" in cfg else "tiled"
                    if not (expl.variant or "").startswith(wants):
                        raise NotApplicable(f"a {wants} kernel config; the call takes the {expl.variant} kernel")
                got = fn(*args, **kwargs)
                backend.synchronize(device)
                _check(case.op, got, ref.to(device), None if mag is None else mag.to(device), tol, dot)
                del got
                for i, before in saved.items():
                    if not torch.equal(args[i], before):
                        raise ValueError(f"modified its input {OPS[case.op].arg_names[i]!r}")
                phases.add("first_call_s", time.perf_counter() - first)
                first = None
                with phases("timing_s"):
                    rec["ms"] = timer(lambda: fn(*args, **kwargs), {"case": sc.id, "who": "xkernels", "cfg": cfg})
        except NotApplicable as exc:
            rec["not_applicable"] = str(exc)
        except Exception as exc:  # a config that fails to compile, run or match is recorded, not fatal
            rec["err"] = _first_line(exc)
        if first is not None:  # failed or not applicable before its timing: all of it was the first call
            phases.add("first_call_s", time.perf_counter() - first)
        by_id[iid] = record(rec)
        if on_item is not None:
            on_item(rec)
    out = [torch_rec] + [by_id[i] for i in sc.item_ids()]
    if confirm_loss is not None and case.op in MATMUL_OPS:
        recs = {r["key"]: r for r in out}
        best = _loses(sc, recs)
        if best is not None and confirm_key in done:
            out.append(done[confirm_key])
        elif best is not None:
            from xkernels.dispatch import use_backend

            def run_best() -> Any:
                with use_backend(backend.name), tuning.force(best):
                    return fn(*args, **kwargs)

            c = confirm_loss(run_best, lambda: torch_fn(*args, **kwargs),
                             {"case": sc.id, "cfg": best, "ms": torch_rec.get("torch_ms")})
            out.append(record({"key": confirm_key, "case": sc.id, "cfg": best, "ms": c["ms"], "ratio": c["ratio"],
                               "spread": c["spread"], "rounds": c["rounds"], "replayed": c.get("replayed", False)}))
    return out


def _loses(sc: SweepCase, recs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest measured config of ``sc`` where it is slower than torch in ``recs``, else ``None``."""
    torch_rec = recs.get(f"torch|{sc.id}")
    timed = [(recs[i]["ms"], cfg) for i, cfg in zip(sc.item_ids(), sc.configs) if "ms" in recs.get(i, {})]
    if torch_rec is None or not timed:
        return None
    ms, cfg = min(timed, key=lambda t: t[0])
    return cfg if ms > torch_rec["torch_ms"] else None


# -- rows ---------------------------------------------------------------------------------------
def rows(sweep: Iterable[SweepCase], records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One measurement row per case with a torch time (the JSONL ``xkernels.cli.matmul_tables`` reads):
    ``{"op", "name", "case", "dtype", "torch_ms", "cfgs": [{"cfg", "ms"} | {"cfg", "err"}], ...}``
    plus ``M, N, K, act, bias`` (matmul/linear) or ``shape, numel, variant`` (element-wise).
    Not-applicable configs are left out of ``cfgs``."""
    out = []
    for sc in sweep:
        torch_rec = records.get(f"torch|{sc.id}")
        if torch_rec is None:
            continue
        c = sc.case
        row: dict[str, Any] = {"op": c.op, "name": c.layout, "case": sc.id, "dtype": dtype_name(c.dtype),
                               "torch_ms": torch_rec["torch_ms"], "cfgs": []}
        if c.op in MATMUL_OPS:
            (m, k), b = c.shapes[0], c.shapes[1]
            row.update(M=m, K=k, N=b[0] if c.op == "linear" else b[1],
                       act=next((a for a in c.args[3:] if isinstance(a, str)), None) if c.op == "linear" else None,
                       bias=c.op == "linear" and c.args[2] is not None)
        else:
            row.update(shape=[list(s) for s in c.shapes if isinstance(s, tuple)], variant=elementwise_variant(c),
                       numel=math.prod(torch.broadcast_shapes(*[s for s in c.shapes if isinstance(s, tuple)])))
        conf = records.get(f"confirm|{sc.id}")
        if conf is not None:
            row["confirmed"] = {k: conf[k] for k in ("cfg", "ms", "ratio", "spread", "rounds")}
        for iid, cfg in zip(sc.item_ids(), sc.configs):
            rec = records.get(iid)
            if rec is None or "not_applicable" in rec:
                continue
            row["cfgs"].append({"cfg": cfg, "ms": rec["ms"]} if "ms" in rec else {"cfg": cfg, "err": rec["err"]})
        out.append(row)
    return out
