"""The plugin manager: loads backend plugins from the ``xkernels.backends`` entry-point group.

Built-in backends are entry points of this distribution, so they load exactly like a
third-party plugin. ``register(plugin)`` adds one at run time (tests, notebooks).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from xkernels import hookspecs
from xkernels.backend import Backend, UnknownBackendError

BUILTIN_PLUGINS = (
    "xkernels.backends.cpu",
    "xkernels.backends.cuda",
    "xkernels.backends.npu",
    "xkernels.backends.interpreter",
)


@dataclass(frozen=True)
class OpImpl:
    """One op implementation that replaces the portable kernel on one backend."""

    op: str
    backend: str
    fn: Callable[..., Any]
    priority: int = 0
    note: str = ""


@dataclass(frozen=True)
class TuningDir:
    """A directory of ``<op>.json`` tuning tables that a plugin adds for a backend."""

    backend: str
    path: Path


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    """Register every plugin of the entry-point group; a broken one is skipped with a warning."""
    for ep in importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # a half-installed plugin must not take xkernels down
            warnings.warn(f"xkernels: backend plugin {ep.name!r} ({ep.value}) failed to load: {exc!r}",
                          RuntimeWarning, stacklevel=3)
            continue
        pm.register(plugin, name=ep.name)


class Registry:
    """Backends, op overrides and tuning directories collected from all plugins."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pm: pluggy.PluginManager | None = None
        self._backends: dict[str, Backend] = {}
        self._impls: dict[tuple[str, str], OpImpl] = {}
        self._tuning: dict[str, tuple[Path, ...]] = {}
        #: Called after every (re)collection, e.g. to drop caches keyed by backend.
        self.listeners: list[Callable[[], None]] = []

    # -- loading ---------------------------------------------------------------------------------
    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        with self._lock:
            if self._pm is None:
                pm = pluggy.PluginManager(hookspecs.PROJECT)
                pm.add_hookspecs(hookspecs)
                _load_entry_points(pm)
                # A source checkout run without `pip install` has no entry points; the built-ins
                # are still registered as the same modules the entry points name.
                for modname in BUILTIN_PLUGINS:
                    if pm.get_plugin(modname.rsplit(".", 1)[-1]) is None:
                        module = importlib.import_module(modname)
                        if not pm.is_registered(module):
                            pm.register(module, name=modname.rsplit(".", 1)[-1])
                pm.check_pending()
                self._pm = pm
                self._collect()
            return self._pm

    def _ensure_loaded(self) -> None:
        if self._pm is None:
            _ = self.plugin_manager

    def register(self, plugin: Any, name: str | None = None) -> None:
        """Register a plugin object or module at run time and re-collect what it adds."""
        pm = self.plugin_manager
        with self._lock:
            pm.register(plugin, name=name)
            pm.check_pending()
            self._collect()

    def unregister(self, plugin: Any = None, name: str | None = None) -> None:
        pm = self.plugin_manager
        with self._lock:
            pm.unregister(plugin, name=name)
            self._collect()

    def _collect(self) -> None:
        assert self._pm is not None
        hook = self._pm.hook
        backends: dict[str, Backend] = {}
        for group in hook.xkernels_add_backends():
            for b in group or ():
                if not isinstance(b, Backend):
                    raise TypeError(f"xkernels_add_backends returned {b!r}, not an xkernels.Backend")
                if b.name in backends:
                    raise ValueError(f"two plugins provide a backend named {b.name!r}")
                backends[b.name] = b
        impls: dict[tuple[str, str], OpImpl] = {}
        for group in hook.xkernels_add_op_impls():
            for impl in group or ():
                key = (impl.op, impl.backend)
                old = impls.get(key)
                if old is not None and old.priority == impl.priority:
                    raise ValueError(f"two plugins override op {impl.op!r} on backend {impl.backend!r} "
                                     f"with the same priority {impl.priority}")
                if old is None or impl.priority > old.priority:
                    impls[key] = impl
        tuning: dict[str, list[Path]] = {}
        for group in hook.xkernels_add_tuning_dirs():
            for td in group or ():
                tuning.setdefault(td.backend, []).append(Path(td.path))
        self._backends = backends
        self._impls = impls
        self._tuning = {k: tuple(v) for k, v in tuning.items()}
        for listener in self.listeners:
            listener()

    # -- queries ---------------------------------------------------------------------------------
    def backends(self) -> dict[str, Backend]:
        self._ensure_loaded()
        return dict(self._backends)

    def backend(self, name: str) -> Backend:
        self._ensure_loaded()
        try:
            return self._backends[name]
        except KeyError:
            known = ", ".join(sorted(self._backends))
            raise UnknownBackendError(f"unknown xkernels backend {name!r}; known backends: {known}") from None

    def op_impl(self, op: str, backend: str) -> OpImpl | None:
        self._ensure_loaded()
        return self._impls.get((op, backend))

    def op_impls(self) -> Iterable[OpImpl]:
        self._ensure_loaded()
        return tuple(self._impls.values())

    def tuning_dirs(self, backend: Backend) -> tuple[Path, ...]:
        """The user's autotune cache first (``xkernels.tuning.cache_dir``), then plugin-added
        directories, then the backend's own."""
        from xkernels.tuning import cache_dir

        self._ensure_loaded()
        return (cache_dir(backend.name), *self._tuning.get(backend.name, ()), *backend.tuning_dirs)


registry = Registry()
