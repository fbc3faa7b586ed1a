"""Tuning tables: data files mapping shape/dtype buckets to kernel configs, per op and backend.

A table is ``<dir>/<op>.json`` in one of the backend's tuning directories::

    {
      "op": "broadcast", "backend": "cuda",
      "source": "how the numbers were obtained (sweep command, device, date)",
      "archs": {
        "sm90":    [ {"when": {"variant": "tiled", "dtype": ["bfloat16"], "numel_min": 16777216},
                      "config": {"BLOCK_M": 8, "BLOCK_N": 1024, "num_warps": 8}}, ... ],
        "default": [ ... ]
      }
    }

Lookup for a call: for each directory (plugin-added first), for each arch key in
``backend.arch_fallbacks(arch)`` (``"Ascend910B3"`` then ``"Ascend910B"``) and finally
``"default"``, the first rule whose ``when`` matches wins; if nothing matches, the op's built-in
default config is used. ``when`` keys: a list (membership), ``<field>_min`` / ``<field>_max``
(inclusive bounds), anything else (equality). The matched config is merged over the op default,
so a rule only lists what it changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xkernels.backend import Backend
from xkernels.cache import tuning_cache_dir
from xkernels.registry import registry


@dataclass(frozen=True)
class Choice:
    """A config and where it came from, for ``explain()``. ``measured``: the rule records the
    measurement it came from (a tuner's or autotune's), as opposed to a hand-set default."""

    config: dict[str, Any]
    source: str
    measured: bool = False
    when: dict[str, Any] = field(default_factory=dict)  # the matching rule's conditions
    record: dict[str, Any] = field(default_factory=dict)  # the rule's "measured" record, if any


_forced: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("xkernels_forced", default=None)
_autotune: contextvars.ContextVar[bool | None] = contextvars.ContextVar("xkernels_autotune", default=None)
_first_use: contextvars.ContextVar[bool | None] = contextvars.ContextVar("xkernels_first_use", default=None)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: writes stay atomic, concurrent merges are not locked
    fcntl = None  # type: ignore[assignment]

_file_lock = threading.Lock()


cache_dir = tuning_cache_dir
"""``$XKERNELS_CACHE_DIR/tuning/<backend>`` (default ``~/.cache/xkernels/tuning/<backend>``): the
user's autotune cache (tables searched first) and the first-use check's verdicts."""


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive access to ``path`` across threads and processes (``flock`` on ``<path>.lock``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock, open(path.with_name(path.name + ".lock"), "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temp file and ``os.replace`` (hold :func:`locked`)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def autotune(enabled: bool = True) -> Iterator[None]:
    """Tune on first use in this block (``enabled=False``: not even with ``XKERNELS_AUTOTUNE=1``):
    a call whose bucket has no measured rule is tuned once and the winner cached (``xkernels.autotune``)."""
    token = _autotune.set(enabled)
    try:
        yield
    finally:
        _autotune.reset(token)


def autotune_enabled() -> bool:
    """Whether autotune on first use is on here: :func:`autotune`, else ``XKERNELS_AUTOTUNE=1``."""
    on = _autotune.get()
    return on if on is not None else os.environ.get("XKERNELS_AUTOTUNE", "") == "1"


@contextlib.contextmanager
def first_use_check(enabled: bool = True) -> Iterator[None]:
    """Turn the matmul/linear first-use check on or off in this block (``enabled=False``: off even
    where ``XKERNELS_FIRST_USE_CHECK`` is unset). On a backend whose BLAS is the default
    (``Backend.kernel_needs_evidence``), a kernel the wave model predicts faster for a bucket with
    no measured evidence is timed once against the BLAS on the device; where the check is off,
    such calls run the BLAS (``ops/matmul/evidence.py``, docs/selection.md)."""
    token = _first_use.set(enabled)
    try:
        yield
    finally:
        _first_use.reset(token)


def first_use_check_enabled() -> bool:
    """Whether the first-use check may run here: :func:`first_use_check`, else
    ``XKERNELS_FIRST_USE_CHECK`` (on unless ``0``)."""
    on = _first_use.get()
    return on if on is not None else os.environ.get("XKERNELS_FIRST_USE_CHECK", "1").strip() != "0"


@contextlib.contextmanager
def force(config: dict[str, Any]) -> Iterator[None]:
    """Use ``config`` (over the op default) for every lookup in this block: for sweeps."""
    token = _forced.set(dict(config))
    try:
        yield
    finally:
        _forced.reset(token)


def forced_config() -> dict[str, Any] | None:
    """The config forced by :func:`force` in this context, or ``None``."""
    f = _forced.get()
    return None if f is None else dict(f)


def forced_key() -> tuple | None:
    """A hashable form of the forced config, or ``None`` when nothing is forced."""
    f = _forced.get()
    return None if f is None else tuple(sorted(f.items()))


@functools.lru_cache(maxsize=256)
def _load(path: Path, mtime: float) -> dict[str, Any]:
    data = json.loads(path.read_text())
    archs = data.get("archs")
    if not isinstance(archs, dict):
        raise ValueError(f"tuning table {path} has no 'archs' mapping")
    for arch, rules in archs.items():
        for i, rule in enumerate(rules):
            if not isinstance(rule.get("config"), dict):
                raise ValueError(f"tuning table {path}: archs[{arch!r}][{i}] has no 'config' object")
    return data


def load_table(path: Path) -> dict[str, Any] | None:
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    return _load(path, mtime)


def matches(when: dict[str, Any], key: dict[str, Any]) -> bool:
    for cond, want in when.items():
        if cond.endswith("_min"):
            if key.get(cond[:-4], 0) < want:
                return False
        elif cond.endswith("_max"):
            if key.get(cond[:-4], 0) > want:
                return False
        elif isinstance(want, list):
            if key.get(cond) not in want:
                return False
        elif key.get(cond) != want:
            return False
    return True


def _tables(op: str, backend: Backend, arch: str) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(path, arch key, table) in lookup order: directories (plugin-added and the user's autotune
    cache first), then the arch's keys from most specific to ``default``."""
    arch_keys = [*backend.arch_fallbacks(arch), "default"]
    for directory in registry.tuning_dirs(backend):
        path = Path(directory) / f"{op}.json"
        table = load_table(path)
        if table is None:
            continue
        for arch_key in arch_keys:
            yield path, arch_key, table


def lookup(op: str, backend: Backend, arch: str, key: dict[str, Any], default: dict[str, Any],
           rules_only: bool = False) -> Choice | None:
    """The config for one call of ``op`` with bucket ``key`` on ``backend``/``arch``.

    ``rules_only``: ``None`` when no rule matches (the caller chooses another way) instead of
    the op's built-in default."""
    forced = _forced.get()
    if forced is not None:
        return Choice({**default, **forced}, "forced by xkernels.tuning.force()")
    for path, arch_key, table in _tables(op, backend, arch):
        for i, rule in enumerate(table["archs"].get(arch_key, ())):
            if matches(rule.get("when", {}), key):
                return Choice({**default, **rule["config"]}, f"{path.name} [{arch_key}] rule {i} ({path.parent})",
                              "measured" in rule, dict(rule.get("when", {})), dict(rule.get("measured") or {}))
    if rules_only:
        return None
    return Choice(dict(default), f"built-in default of op {op!r} (no table rule matched)")


def rules(op: str, backend: Backend, arch: str) -> Iterator[dict[str, Any]]:
    """Every rule of ``op``'s tables for ``backend``/``arch``, in lookup order (what
    :func:`lookup` may match)."""
    for _, arch_key, table in _tables(op, backend, arch):
        yield from table["archs"].get(arch_key, ())


def candidates(op: str, backend: Backend, arch: str, key: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The candidate configs of ``op`` for bucket ``key``, and where they came from: every
    group of the first table section ``"candidates"[arch key]`` that has a group matching
    ``key`` (same order as rules). A group is ``{"when": {...}, "configs": [...]}``; a config may
    carry a fitted ``"cost"`` (see ``xkernels.ops.matmul.config``). ``([], "")`` when none."""
    for path, arch_key, table in _tables(op, backend, arch):
        groups = [g for g in table.get("candidates", {}).get(arch_key, ()) if matches(g.get("when", {}), key)]
        if groups:
            return [dict(c) for g in groups for c in g["configs"]], f"{path.name} [{arch_key}] candidates ({path.parent})"
    return [], ""


def table_paths(op: str, backend: Backend) -> list[Path]:
    return [Path(d) / f"{op}.json" for d in registry.tuning_dirs(backend) if (Path(d) / f"{op}.json").exists()]
