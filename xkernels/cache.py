"""Where xkernels keeps what it measures on a machine: ``$XKERNELS_CACHE_DIR``, by default
``~/.cache/xkernels``. ``peaks.json`` holds the measured ceilings (``xkernels.peaks``);
``tuning/<backend>/<op>.json`` the rules tuned on this machine (``xkernels.autotune``), a tuning
directory the registry searches before the shipped tables."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$XKERNELS_CACHE_DIR``, else ``~/.cache/xkernels``; read on every call (tests move it)."""
    return Path(os.environ.get("XKERNELS_CACHE_DIR") or os.path.join(Path.home(), ".cache", "xkernels"))


def tuning_cache_dir(backend: str) -> Path:
    """``<cache root>/tuning/<backend>``: the tables autotune writes for ``backend``."""
    return cache_root() / "tuning" / backend
