"""Per-device ceilings: copy bandwidth and matmul peak, measured once and cached.

The cache is a JSON file (``$XKERNELS_CACHE_DIR`` or ``~/.cache/xkernels``/peaks.json) keyed by
backend and device name. The perf harness measures; ``DeviceProperties`` reads.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from xkernels.backend import Figure
from xkernels.cache import cache_root

_lock = threading.Lock()


def cache_path() -> Path:
    root = cache_root()
    return Path(root) / "peaks.json"


def _load() -> dict[str, Any]:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def cached_figure(backend: str, device_name: str, key: str) -> Figure | None:
    """A measured figure from the cache, or ``None`` if this device was never measured."""
    entry = _load().get(f"{backend}/{device_name}", {}).get(key)
    if not entry:
        return None
    return Figure(entry["value"], entry["unit"], "measured", entry.get("note", ""))


def store_figure(backend: str, device_name: str, key: str, fig: Figure) -> None:
    with _lock:
        data = _load()
        data.setdefault(f"{backend}/{device_name}", {})[key] = {
            "value": fig.value, "unit": fig.unit, "note": fig.note,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        path = cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError:
            pass  # a read-only home must not fail a benchmark
