"""The op front door shared by every op: validate, pick the backend, then route the call.

Routing for a validated call on backend ``b``:

1. a plugin's :class:`xkernels.OpImpl` for (op, ``b.name``), if one is registered;
2. the op's portable Triton kernel, if ``b.runs_triton`` and the dtypes are kernel dtypes;
3. PyTorch (the cpu backend, and documented fallback dtypes such as float64 and complex).

``op.explain(*args, **kwargs)`` answers which of these runs, with which kernel variant and
config, and why, without running anything.

Repeated calls. A call that took route 2 with positional arguments (and at most a tensor
``out=``) leaves a *hot entry* keyed by its signature: the ``use_backend`` override in effect,
each tensor's shape, strides, dtype and device, and every other argument by type and value. Everything ``check`` and the
routing decided is a function of that signature, so the next call with the same signature skips
them: it allocates the result and launches (``Launcher.hot``). Hot entries are not made or used
while a tuning config is forced, and are dropped when a plugin registers. Other keyword
arguments (``alpha=``) always take the full path.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from xkernels import dispatch, tuning
from xkernels.backend import Backend
from xkernels.dispatch import _override
from xkernels.registry import registry
from xkernels.tuning import _forced


@dataclass(frozen=True)
class Explanation:
    """What one call would do."""

    op: str
    backend: str
    route: str  # "plugin override" | "triton kernel" | "vendor BLAS" | "torch"
    reason: str
    variant: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    config_source: str | None = None
    programs: int | None = None
    tiles: int | None = None
    why: str | None = None

    def __str__(self) -> str:
        lines = [f"{self.op} on backend {self.backend!r}: {self.route} ({self.reason})"]
        if self.variant:
            lines.append(f"  kernel variant: {self.variant}")
        if self.tiles is not None:
            persist = " (persistent loop)" if self.programs is not None and self.programs < self.tiles else ""
            lines.append(f"  launch: {self.programs} programs for {self.tiles} tiles{persist}")
        if self.config:
            cfg = ", ".join(f"{k}={v}" for k, v in self.config.items())
            lines.append(f"  config: {cfg}")
            lines.append(f"  from: {self.config_source}")
            if self.why:
                lines.append(f"  why: {self.why}")
        return "\n".join(lines)


class Plan:
    """A prepared kernel launch for one call signature (cached; the per-call path)."""

    variant: str
    config: dict[str, Any]
    source: str
    programs: int
    tiles: int
    why: str = ""
    route: str = "triton kernel"

    def run(self, *args: Any) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class Op:
    """Base class of the public ops. Subclasses implement ``check``, ``torch_impl``, ``plan``."""

    name: str = ""
    plan_cache_size = 512

    def __init__(self) -> None:
        self._plans: OrderedDict[Any, Plan] = OrderedDict()
        self._hot: dict[Any, Callable[..., torch.Tensor | None]] = {}
        self._ready: set[str] = set()
        # a plugin registered later may add tuning tables or replace a backend: plan again
        registry.listeners.append(self._forget)

    def _forget(self) -> None:
        self._plans.clear()
        self._hot.clear()
        self._ready.clear()

    # -- subclass interface -------------------------------------------------------------------
    def check(self, *args: Any, **kwargs: Any) -> Any:
        """Validate arguments; return a call record with ``.device`` and ``.kernel_ok``."""
        raise NotImplementedError

    def torch_impl(self, call: Any) -> torch.Tensor:
        raise NotImplementedError

    def plan_key(self, call: Any, backend: Backend) -> Any:
        raise NotImplementedError

    def make_plan(self, call: Any, backend: Backend) -> Plan:
        raise NotImplementedError

    def run_plan(self, plan: Plan, call: Any) -> torch.Tensor:
        raise NotImplementedError

    def make_hot(self, plan: Plan, call: Any, args: tuple[Any, ...]) -> Callable[..., torch.Tensor | None] | None:
        """A function of the arguments of a call with this signature (positional ``args``, and
        ``out=`` if ``call.out`` is set) that runs it, or returns ``None`` to have the full path
        run it; ``None`` here when not applicable."""
        return None

    # -- routing ------------------------------------------------------------------------------
    def _backend(self, call: Any) -> Backend:
        backend = dispatch.select(call.device)
        if backend.name not in self._ready:
            backend.require_available()
            self._ready.add(backend.name)
        return backend

    def plan(self, call: Any, backend: Backend) -> Plan:
        key = self.plan_key(call, backend)
        forced = tuning.forced_key()
        if forced is not None:  # a sweep: cache per forced config
            key = (key, forced)
        plan = self._plans.get(key)
        if plan is None:
            plan = self.make_plan(call, backend)
            self._plans[key] = plan
            if len(self._plans) > self.plan_cache_size:
                self._plans.popitem(last=False)
        return plan

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.call_no_grad(*args, **kwargs)

    def call_no_grad(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The eager call without autograd recording: hot entry, else check, route and launch."""
        if self._hot and _forced.get() is None:
            try:
                hot = self._hot.get(_key(args) if not kwargs else _out_key(args, kwargs))
            except TypeError:  # an unhashable argument
                hot = None
            if hot is not None:
                result = hot(*args, **kwargs)
                if result is not None:
                    return result
        call = self.check(*args, **kwargs)
        backend = self._backend(call)
        impl = registry.op_impl(self.name, backend.name)
        if impl is not None:
            return impl.fn(*args, **kwargs)
        if not backend.runs_triton or not call.kernel_ok:
            return self.torch_impl(call)
        plan = self.plan(call, backend)
        result = self.run_plan(plan, call)
        if _forced.get() is None:
            self._remember(args, kwargs, plan, call)
        return result

    def _remember(self, args: tuple[Any, ...], kwargs: dict[str, Any], plan: Plan, call: Any) -> None:
        try:
            key = _key(args) if not kwargs else _out_key(args, kwargs)
            hash(key)
        except TypeError:
            return
        if key is None:
            return
        if key in self._hot:
            return
        try:
            hot = self.make_hot(plan, call, args)
        except Exception:  # the call itself succeeded; its repeats keep the full path
            hot = None
        if hot is not None:
            if len(self._hot) >= self.plan_cache_size:
                self._hot.clear()
            self._hot[key] = hot

    def explain(self, *args: Any, **kwargs: Any) -> Explanation:
        """Which backend, route, kernel variant and config a call with these arguments uses."""
        call = self.check(*args, **kwargs)
        backend = dispatch.select(call.device)
        how = "by override" if dispatch.override_name() else f"tensors are on {call.device.type}"
        impl = registry.op_impl(self.name, backend.name)
        if impl is not None:
            mod = getattr(impl.fn, "__module__", "?")
            return Explanation(self.name, backend.name, "plugin override",
                               f"{how}; {mod}.{getattr(impl.fn, '__qualname__', impl.fn)} is registered "
                               f"for ({self.name!r}, {backend.name!r}) {impl.note}".strip())
        if not backend.runs_triton:
            return Explanation(self.name, backend.name, "torch", f"{how}; backend {backend.name!r} runs PyTorch")
        if not call.kernel_ok:
            return Explanation(self.name, backend.name, "torch", f"{how}; {call.fallback_reason}")
        plan = self.make_plan(call, backend)
        return Explanation(self.name, backend.name, plan.route, how, plan.variant, dict(plan.config),
                           plan.source, plan.programs, plan.tiles, plan.why or None)


def _key(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The hot-entry key of a call's positional arguments (two tensors: spelled out, for speed)."""
    if len(args) == 2:
        a, b = args
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return (_override.get(), a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device)
    return (_override.get(), *map(_signature, args))


def _out_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The hot-entry key of a call whose only keyword is a tensor ``out=``; else ``None``."""
    if len(kwargs) == 1:
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor):
            return (*_key(args), "out", out.shape, out.stride(), out.dtype, out.device)
    return None


def _signature(arg: Any) -> Any:
    """The part of one argument that ``check`` and planning depend on (see the module doc)."""
    if isinstance(arg, torch.Tensor):
        return (arg.shape, arg.stride(), arg.dtype, arg.device)
    return (type(arg), arg)
