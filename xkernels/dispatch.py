"""Which backend runs a call: the tensors' device, unless overridden.

Order of precedence, highest first:

1. ``with xkernels.use_backend("name"):`` (context-local: each thread and asyncio task has its own);
2. the ``XKERNELS_BACKEND`` environment variable, read once when xkernels is imported (the ops'
   per-call path does not consult the environment);
3. the tensors' device type: the registered backend with that ``device_type`` that is marked
   ``default_for_device`` (cuda tensors run on "cuda", npu on "npu", cpu on "cpu").

An override must serve the tensors' device type (e.g. "interpreter" serves cpu tensors).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from xkernels.backend import Backend
from xkernels.backends import native
from xkernels.registry import registry

ENV_VAR = "XKERNELS_BACKEND"
_env_backend: str | None = os.environ.get(ENV_VAR) or None

_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("xkernels_backend", default=None)
_by_device_type: dict[str, Backend] = {}
_count_lock = threading.Lock()
registry.listeners.append(_by_device_type.clear)


def list_backends() -> list[str]:
    """Names of every registered backend, available here or not."""
    return sorted(registry.backends())


def get_backend(name_or_device: str | torch.device | Backend | None = None) -> Backend:
    """The backend for a name (``"cuda"``), a device (``"cuda:1"``, ``torch.device``) or ``None``.

    ``None`` means the current override, else the best backend available here.
    """
    if isinstance(name_or_device, Backend):
        return name_or_device
    if name_or_device is None:
        name = _override.get() or _env_backend
        return registry.backend(name) if name else best_available()
    if isinstance(name_or_device, torch.device):
        return backend_for_device_type(name_or_device.type)
    names = registry.backends()
    if name_or_device in names:
        return names[name_or_device]
    try:
        dev = torch.device(name_or_device)
    except (RuntimeError, TypeError):
        return registry.backend(name_or_device)  # raises UnknownBackendError listing the names
    return backend_for_device_type(dev.type)


def backend_for_device_type(device_type: str) -> Backend:
    b = _by_device_type.get(device_type)
    if b is not None:
        return b
    for cand in registry.backends().values():
        if cand.device_type == device_type and cand.default_for_device:
            _by_device_type[device_type] = cand
            return cand
    known = sorted({b.device_type for b in registry.backends().values()})
    raise ValueError(f"no xkernels backend serves torch device type {device_type!r}; "
                     f"served device types: {', '.join(known)}")


def best_available() -> Backend:
    """The available backend of highest ``priority`` (cpu on a machine with nothing else)."""
    cands = [b for b in registry.backends().values() if b.default_for_device and b.is_available()]
    return max(cands, key=lambda b: b.priority)


@contextlib.contextmanager
def use_backend(name: str | Backend) -> Iterator[Backend]:
    """Run the ops in this block on backend ``name`` (context-local, safe across threads)."""
    backend = name if isinstance(name, Backend) else registry.backend(name)
    token = _override.set(backend.name)
    _count_override(1)
    try:
        yield backend
    finally:
        _override.reset(token)
        _count_override(-1)


_active_overrides = 0


def _count_override(step: int) -> None:
    """Counts the ``use_backend`` blocks open in the process, for enable()'s native overrides
    (``backends/native.cpp``), which defer every call to Python while any is open."""
    global _active_overrides
    with _count_lock:
        _active_overrides += step
        mod = native.ready()
        if mod is not None:
            mod.set_overrides_active(_active_overrides)


def _native_loaded(mod: Any) -> None:
    with _count_lock:  # the blocks opened before the extension loaded
        mod.set_overrides_active(_active_overrides)


native.on_load.append(_native_loaded)


def active_overrides() -> int:
    return _active_overrides


def override_name() -> str | None:
    """The backend name forced by ``use_backend`` or ``XKERNELS_BACKEND``, if any."""
    return _override.get() or _env_backend


def select(device: torch.device) -> Backend:
    """The backend that runs an op whose tensors live on ``device`` (the per-call hot path)."""
    name = _override.get() or _env_backend
    if not name:
        return _by_device_type.get(device.type) or backend_for_device_type(device.type)
    backend = registry.backend(name)
    if backend.device_type != device.type:
        raise ValueError(f"xkernels backend {backend.name!r} runs on {backend.device_type!r} tensors, "
                         f"but the tensors are on {device}")
    return backend


def runs_kernels(device: torch.device) -> bool:
    """Whether the backend that runs calls on ``device`` tensors runs kernels of its own. The cpu
    backend runs PyTorch's ops: there a patched module's xkernels path would be the model's own
    ops behind the op's front door, host time that saves no bytes, so patched modules run the code
    they replace (``xkernels.nn``, ``xkernels.block_steps.as_written``). A forced backend for
    another device type counts as one that does: the op's own call then raises what it raises."""
    if not (_override.get() or _env_backend):  # the device type's default backend (the per-call path)
        backend = _by_device_type.get(device.type)
        if backend is not None:
            return backend.runs_triton
    try:
        return select(device).runs_triton
    except ValueError:
        return True
