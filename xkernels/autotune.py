"""Autotune on first use: a call whose bucket has no measured rule is tuned once, on its device,
and the winner is cached for every later call and process.

Off by default. On with ``XKERNELS_AUTOTUNE=1`` or inside ``with xkernels.tuning.autotune():``.
When ``Op.plan`` makes a plan whose config does not come from a measured rule (and no config is
forced, as in a sweep), :func:`tune`:

1. takes the candidates of the op's tables (``tuning.candidates``; else the built-in lists of
   ``matmul_config`` / ``xkernels.sweep``);
2. runs each under ``tuning.force`` on clones of the call's inputs, into a NaN-filled output,
   checks it against the op's PyTorch implementation (twice the harness tolerance: both sides
   round) and the inputs unchanged, and times it with the harness timer;
3. writes the fastest as a rule with a ``"measured"`` record to the user cache
   ``$XKERNELS_CACHE_DIR/tuning/<backend>/<op>.json`` (default ``~/.cache/xkernels``; same format as
   the shipped tables, a tuning directory searched before them), for the call's bucket:
   matmul/linear its exact N, K, batch, dtype, activation and bias with M in its power-of-two
   range; add/broadcast its kernel variant, dtype and size class;
4. plans the call again, now from the cached rule.

Writes take an exclusive ``flock`` on ``<op>.json.lock``, re-read the file, merge and replace it
atomically (temp file + ``os.replace``), so processes tuning at once never corrupt it or drop
each other's rules. The first tuned call of a process warns once, naming the cache.
``python -m xkernels.tune --export-cache --backend B --out-dir D`` copies the cache as tables.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

from xkernels import tuning
from xkernels.cache import tuning_cache_dir
from xkernels.hookspecs import hookimpl

_warned = False
_tuned: set[str] = set()  # buckets tuned by this process: never twice, whatever the cache holds
_lock = threading.Lock()  # threads: one of them claims a bucket and warns once


cache_dir = tuning_cache_dir
"""``$XKERNELS_CACHE_DIR/tuning/<backend>`` (default ``~/.cache/xkernels/tuning/<backend>``)."""
_locked = tuning.locked


# -- the cache file -----------------------------------------------------------------------------
def write_rules(op: str, backend: str, arch: str, rules: list[dict[str, Any]]) -> Path:
    """Merge ``rules`` into the cache table of (``op``, ``backend``) under ``arch``: a cached rule
    with the same ``when`` is replaced, the new rules go first. Atomic and locked."""
    path = cache_dir(backend) / f"{op}.json"
    with _locked(path):
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {"op": op, "backend": backend, "archs": {}}
        table["source"] = (f"xkernels autotune cache: rules measured on first use on this machine "
                           f"(last {datetime.datetime.now().isoformat(timespec='seconds')})")
        whens = [json.dumps(r["when"], sort_keys=True) for r in rules]
        kept = [r for r in table["archs"].get(arch, []) if json.dumps(r["when"], sort_keys=True) not in whens]
        table["archs"][arch] = rules + kept
        tuning.write_json_atomic(path, table)
    tuning._load.cache_clear()  # the next lookup reads the new file even within one mtime tick
    return path


def export(backend: str, out_dir: Path) -> list[Path]:
    """Copy the cache tables of ``backend`` to ``out_dir`` (tables to review and commit)."""
    written = []
    for path in sorted(cache_dir(backend).glob("*.json")):
        table = json.loads(path.read_text())
        table["source"] = f"{table.get('source', '')}; exported from {path}"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / path.name).write_text(json.dumps(table, indent=1) + "\n")
        written.append(out_dir / path.name)
    return written


# -- buckets ------------------------------------------------------------------------------------
def _pow2_range(v: int) -> tuple[int, int]:
    lo = 1 << max(0, int(v).bit_length() - 1) if v > 0 else 0
    return lo, max(lo * 2 - 1, 0)


def bucket(op_name: str, call: Any, plan: Any) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(candidate key, rule ``when``, label) of a call's bucket."""
    dt = str(call.dtype).removeprefix("torch.")
    if op_name in ("matmul", "linear"):
        m, k, n = call.a.shape[-2], call.a.shape[-1], call.b.shape[-1]
        batch = math.prod(call.batch) if call.batch else 1
        act, bias = call.activation or "none", call.bias is not None
        lo, hi = _pow2_range(m)
        key = {"dtype": dt, "m": m, "n": n, "k": k, "batch": batch, "activation": act, "bias": bias}
        when = {"dtype": [dt], "n": n, "k": k, "batch": batch, "activation": act, "bias": bias, "m_min": lo, "m_max": hi}
        return key, when, f"{dt} M={m} N={n} K={k} batch={batch} {act}{' + bias' if bias else ''}"
    from xkernels.sweep import NUMEL_CLASSES

    variant = "flat" if plan.variant.startswith("flat") else "tiled"
    numel = math.prod(call.shape)
    lo, hi = next((lo, hi) for lo, hi, _ in NUMEL_CLASSES if lo <= numel <= hi)
    return ({"variant": variant, "dtype": dt},
            {"variant": variant, "dtype": [dt], "numel_min": lo, "numel_max": hi},
            f"{dt} {variant} {numel} elements")


def _candidates(op_name: str, backend: Any, arch: str, key: dict[str, Any]) -> list[dict[str, Any]]:
    cands, _ = tuning.candidates(op_name, backend, arch, key)
    if not cands:
        if op_name in ("matmul", "linear"):
            from xkernels.ops.matmul.config import BUILTIN_CANDIDATES as cands
        else:
            from xkernels.sweep import ELEMENTWISE_CANDIDATES

            cands = ELEMENTWISE_CANDIDATES[key["variant"]]
    unique = {json.dumps({k: v for k, v in c.items() if k != "cost"}, sort_keys=True) for c in cands}
    return [json.loads(u) for u in sorted(unique)]


# -- tuning one call ----------------------------------------------------------------------------
def _clone_call(call: Any) -> Any:
    """The call with every input tensor cloned (so a trial can never touch the user's tensors)."""
    fields = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}
    return dataclasses.replace(call, **{k: v.clone() for k, v in fields.items()
                                        if isinstance(v, torch.Tensor) and k != "out"}, out=None)


def _applies(cfg: dict[str, Any], plan: Any, op_name: str) -> bool:
    if cfg.get("TMA") and not plan.config.get("TMA"):
        return False
    if op_name in ("add", "broadcast"):
        return plan.variant.startswith("flat" if "BLOCK" in cfg else "tiled")
    return True


@hookimpl
def xkernels_tune_plan(op: Any, call: Any, backend: Any, plan: Any) -> Any:
    """The autotune plugin: ``Op.plan`` asks it for a plan of a bucket with no measured rule."""
    return tune(op, call, backend, plan)


def tune(op: Any, call: Any, backend: Any, plan: Any) -> Any:
    """Tune ``call``'s bucket (see the module doc) and return its new plan (``plan`` itself when
    no candidate works, with a warning)."""
    global _warned
    from xkernels.harness import Target, tolerances
    from xkernels.harness.perf import Settings, time_calls
    from xkernels.sweep import _check

    key, when, label = bucket(op.name, call, plan)
    arch = backend.arch(call.device)
    path = cache_dir(backend.name) / f"{op.name}.json"
    seen = json.dumps([op.name, backend.name, arch, when], sort_keys=True)
    with _lock:  # threads: one of them tunes a bucket, and warns once
        if seen in _tuned:
            return plan
        _tuned.add(seen)
        first, _warned = not _warned, True
    if first:
        warnings.warn(f"xkernels: autotuning {op.name} {label} on {call.device}; results cached in {path}",
                      RuntimeWarning, stacklevel=5)
    trial = _clone_call(call)
    originals = {f.name: getattr(trial, f.name).clone() for f in dataclasses.fields(trial)
                 if isinstance(getattr(trial, f.name), torch.Tensor)}
    ref = op.torch_impl(trial)
    tol = tolerances.tolerance(op.name, ref.dtype, backend)
    mag = None
    if op.name in ("matmul", "linear"):
        mag = torch.matmul(trial.a.abs().double(), trial.b.abs().double())
        mag = (mag + trial.bias.abs().double() if trial.bias is not None else mag).reshape(ref.shape)
    dot = (2 * tol.dot_coefficient(call.a.shape[-1], call.activation, getattr(call, "residual", None) is not None)
           if mag is not None else 0.0)
    tol2 = dataclasses.replace(tol, rtol=2 * tol.rtol, atol=2 * tol.atol)
    ref64 = ref.double() if ref.dtype.is_floating_point else ref.long()
    timing = Settings(warmup=2, warmup_s=0.02, min_reps=5, max_reps=30, budget_s=0.05, flush=True)
    target = Target(backend, call.device)
    out = torch.empty_like(ref)
    trial_out = dataclasses.replace(trial, out=out)
    results: list[tuple[float, dict[str, Any]]] = []
    errors: list[str] = []
    for cfg in _candidates(op.name, backend, arch, key):
        try:
            with tuning.force(cfg):
                p = op.make_plan(trial_out, backend)
                if not _applies(cfg, p, op.name):
                    continue
                out.fill_(float("nan") if out.dtype.is_floating_point else torch.iinfo(out.dtype).min)
                got = op.run_plan(p, trial_out)
                backend.synchronize(call.device)
                _check(op.name, got, ref64, mag, tol2, dot)
                for name, before in originals.items():
                    if not torch.equal(getattr(trial, name), before):
                        raise ValueError(f"modified its input {name!r}")
                ms = time_calls(lambda _: op.run_plan(p, trial_out), [None], target, timing).median_ms
            results.append((ms, cfg))
        except Exception as exc:  # noqa: BLE001 - a config that fails here is not a candidate
            errors.append(f"{cfg}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}")
    if not results:
        warnings.warn(f"xkernels: autotune found no working config for {op.name} {label} on {call.device} "
                      f"({len(errors)} failed; first: {errors[:1]}); the call keeps {plan.source}",
                      RuntimeWarning, stacklevel=5)
        return plan
    torch_ms = time_calls(lambda _: op.torch_impl(trial), [None], target, timing).median_ms
    best = min(results, key=lambda r: r[0])
    shape = [list(t.shape) for t in (getattr(call, "a", None), getattr(call, "b", None),
                                      getattr(call, "x", None), getattr(call, "y", None))
             if isinstance(t, torch.Tensor)]

    def rule(w: dict[str, Any], ms: float, cfg: dict[str, Any]) -> dict[str, Any]:
        return {"when": w, "config": cfg,
                "measured": {"shapes": [shape], "ms": round(ms, 6), "torch_ms": round(torch_ms, 6),
                             "worst_ratio": round(torch_ms / ms, 3), "candidates": len(results) + len(errors),
                             "failed": len(errors), "by": "autotune", "device": str(call.device)}}

    rules = []
    if best[1].get("TMA"):  # as the tables do: a TMA rule, then the best pointer config for the rest
        rules.append(rule({"variant": "tma", **when}, *best))
        best = min((r for r in results if not r[1].get("TMA")), key=lambda r: r[0], default=None)
    if best is not None:
        rules.append(rule(when, *best))
    write_rules(op.name, backend.name, arch, rules)
    return op.make_plan(call, backend)
