"""The op front door shared by every op: validate, pick the backend, then route the call.

``op(*args, **kwargs)`` (``Op.__call__``), first match wins:

1. while ``torch.compile``/``torch.export`` trace (``torch.compiler.is_compiling()``): the
   registered custom op ``torch.ops.xkernels.<op>`` (``op.library_call``, ``ops/library.py``),
   one opaque graph node with a fake implementation and autograd;
2. grad mode on and a tensor argument requiring grad: a signature whose hot entry computes with
   PyTorch's own ops (a vendor-BLAS plan) runs that entry, and autograd records torch's ops and
   their derivatives; any other is recorded by autograd through the op's ``autograd.Function``
   (``op.autograd``, ``ops/autograd.py``), whose forward is ``call_no_grad``;
3. ``call_no_grad``: the eager path below.

Either way the arguments are first bound to the op's ``params`` (``canonical``).

Routing for a validated call on backend ``b``:

1. a plugin's :class:`xkernels.OpImpl` for (op, ``b.name``), if one is registered;
2. the op's portable Triton kernel, if ``b.runs_triton`` and the dtypes are kernel dtypes;
3. PyTorch (the cpu backend, and documented fallback dtypes such as float64 and complex).

``op.explain(*args, **kwargs)`` answers which of these runs, with which kernel variant and
config, and why, without running anything.

Repeated calls. A call that took route 2 leaves a *hot entry* keyed by its signature: its
arguments bound to the op's ``params`` (positional or keyword, defaults filled in), then per
parameter (``Param.key``): each tensor's shape, strides, dtype and device, a Python number's type,
``alpha``'s type and whether it is 1, ``activation``'s value; plus the ``use_backend`` override in
effect. Everything ``check`` and the routing decided is a function of that signature, so the next
call with the same signature skips them: the entry allocates the result and launches
(``Launcher.hot``), taking the call's own tensors and its scalar values (a Python number operand,
``alpha``, ``negative_slope``) as arguments. Every documented call form repeats this way
(``add(x, y, alpha=2)``, ``add(x, 2.0)``, ``linear(x, w, bias=b, activation="gelu")``,
``broadcast(x, b, out=o)``); ``matmul``/``linear`` with ``out=`` and ``add`` of a Python number
with ``out=`` keep the full path. Hot entries are not made or used while a tuning config is
forced, and are dropped when a plugin registers.

Threads. Calls from many threads at once are safe: the backend override and a forced config are
context-local (``use_backend``, ``tuning.force``); a plan is made (and its bucket autotuned) by one
thread at a time per op (``_plan_lock``; a thread finding the plan made meanwhile takes it); the
caches are dicts whose single operations the interpreter lock makes atomic; and a backend whose
kernels cannot run concurrently serializes its launches itself (the interpreter backends).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from xkernels import dispatch, tuning
from xkernels.backend import Backend
from xkernels.dispatch import _override
from xkernels.ops import library
from xkernels.ops.autograd import needs_grad, reject_out
from xkernels.registry import registry
from xkernels.tuning import _forced

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_grad_enabled = torch.is_grad_enabled
Tensor = torch.Tensor
#: whether any tensor among the arguments requires grad (PyTorch's C helper where it has one)
_any_requires_grad = getattr(torch._C, "_any_requires_grad", None) or (lambda *values: needs_grad(values))

#: ``Op.find_hot``'s answer: (signature key, hot entry, the call's arguments in ``params`` order)
HotCall = tuple[Any, Callable[..., torch.Tensor | None], tuple[Any, ...]]


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
    measured: bool = False  # the config comes from a rule with a "measured" record

    def run(self, *args: Any) -> None:  # pragma: no cover - interface
        raise NotImplementedError


#: Every op object made, by name, in the order they were made (the compile check walks them).
REGISTERED: dict[str, Op] = {}

REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "<required>"})()


@dataclass(frozen=True)
class Param:
    """One parameter of an op's signature. ``key`` says what of its value a hot entry's key holds:
    ``"layout"`` (a tensor's shape, strides, dtype, device; another value's type), ``"value"``
    (the value itself: e.g. ``activation``), ``"alpha"`` (the type and whether it equals 1),
    ``"type"`` (the type: e.g. ``negative_slope``); whatever the key does not hold (scalar values,
    ``alpha``, the slope) is passed to the hot entry with every call and never baked into it."""

    name: str
    default: Any = REQUIRED
    positional: bool = True
    key: str = "layout"


class Op:
    """Base class of the public ops. Subclasses implement ``check``, ``torch_impl``, ``plan``,
    ``autograd`` and declare ``params`` (positional parameters first, in order)."""

    name: str = ""
    params: tuple[Param, ...] = ()
    plan_cache_size = 512

    def __init__(self) -> None:
        self._index = {p.name: i for i, p in enumerate(self.params)}
        self._defaults = tuple(p.default for p in self.params)
        self._n_positional = sum(p.positional for p in self.params)
        self._n_required = sum(p.default is REQUIRED for p in self.params)
        self._keys = tuple(p.key for p in self.params)
        self._after_two = self._defaults[2:]  # the defaults a two-argument call leaves
        # op(a, b, name=value) with every other parameter defaulted: name -> (key kind, the
        # defaults before and after it), for the hot lookup of that form
        self._keyword_forms = {p.name: (p.key, self._defaults[2:i], self._defaults[i + 1:])
                               for i, p in enumerate(self.params)
                               if i >= 2 and all(j == i for j in range(2, self._n_required))}
        self._plans: OrderedDict[Any, Plan] = OrderedDict()
        REGISTERED.setdefault(self.name, self)
        self._hot: dict[Any, Callable[..., torch.Tensor | None]] = {}
        self._ready: set[str] = set()
        self._plan_lock = threading.RLock()  # re-entrant: making a plan may call the op (autotune)
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

    def without_backend(self, call: Any) -> bool:
        """Whether ``call`` has no tensor operand (``add(2, 3)``): then no backend is involved and
        PyTorch computes it (``torch_impl``), as torch does, whatever backend is selected."""
        return False

    def settle(self, call: Any, backend: Backend, plan: Plan) -> Plan:
        """The plan a new signature runs, given the one ``make_plan`` chose (which ``explain``
        shows without running anything): ops that measure on first use override this."""
        return plan

    def compile_cases(self, target: Any) -> Any:
        """The npu kernel compilations this op's tuning entries imply on ``target.soc`` (an
        ``xkernels.compile_cases.CompileTarget``): an iterable of ``CompileCase``, checked by
        ``python -m xkernels.npu_compile``. Default: none (an op without npu kernels)."""
        return ()

    def make_hot(self, plan: Plan, call: Any, canon: tuple[Any, ...]) -> Callable[..., torch.Tensor | None] | None:
        """A function of the arguments of a call with this signature, in ``params`` order
        (``canon``: this call's), that runs it, or returns ``None`` to have the full path run it;
        ``None`` here when not applicable. ``op(a, b)`` calls its entry with the two tensors
        alone: an entry whose trailing defaults are not the op's is wrapped (``_remember``)."""
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
            with self._plan_lock:  # one thread makes (and autotunes) a plan; the others then find it
                plan = self._plans.get(key)
                if plan is None:
                    plan = self.make_plan(call, backend)
                    if forced is None and not plan.measured and tuning.autotune_enabled():
                        # tune this bucket once (xkernels.autotune, a built-in plugin), then plan from its rule
                        tuned = registry.plugin_manager.hook.xkernels_tune_plan(op=self, call=call, backend=backend,
                                                                                plan=plan)
                        plan = plan if tuned is None else tuned
                    elif forced is None:
                        plan = self.settle(call, backend, plan)  # the first-use check, where one is due
                    self._plans[key] = plan
                    while len(self._plans) > self.plan_cache_size:
                        self._plans.popitem(last=False)
        return plan

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Run the op: the registered custom op while compiling, recorded by autograd where a
        gradient is required, else the eager path (``call_no_grad``)."""
        if _is_compiling():
            return self._compiled(self._bind(args, kwargs))
        if kwargs:
            if _grad_enabled() and _any_requires_grad(*args, *kwargs.values()):
                return self._recorded(args, kwargs)
            if len(args) == 2 and len(kwargs) == 1 and self._hot and _forced.get() is None:
                # op(a, b, name=value): ``_hot_lookup``'s keyword form without its frames
                a, b = args
                if isinstance(a, Tensor) and isinstance(b, Tensor):
                    found = self._one_keyword(a, b, kwargs)
                    if found:
                        try:
                            hot = self._hot.get(found[0])
                        except TypeError:  # an unhashable value (an activation given as a list)
                            hot = None
                        if hot is not None:
                            result = hot(*found[1])
                            if result is not None:
                                return result
            return self._eager(args, kwargs)
        if _grad_enabled() and _any_requires_grad(*args):
            return self._recorded(args, kwargs)
        if len(args) == 2 and self._hot and _forced.get() is None:
            # op(a, b) with two tensors, the most frequent call: ``_hot_lookup``'s "2t" key spelled
            # out (the same tuple, or repeats would re-check: tests/ops/test_op.py counts checks)
            a, b = args
            if isinstance(a, Tensor) and isinstance(b, Tensor):
                hot = self._hot.get(("2t", _override.get(), a.shape, a.stride(), a.dtype, a.device, b.shape,
                                     b.stride(), b.dtype, b.device))
                if hot is not None:
                    result = hot(a, b)  # the entry's defaults are the op's (``_remember``)
                    if result is not None:
                        return result
                return self._full_path(args, kwargs)
        return self._eager(args, kwargs)

    def _recorded(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        """A call with a tensor requiring grad (grad mode on), recorded by autograd: a hot entry
        computing with PyTorch's own ops (a vendor-BLAS plan) has an ``autograd_entry`` that
        runs them (autograd records torch's ops; the backward is aten's); any other call goes
        through the op's ``autograd.Function``."""
        found = self.find_hot(args, kwargs)
        recorded = None if found is None else getattr(found[1], "autograd_entry", None)
        if recorded is not None:
            return recorded(*found[2])
        return self.autograd(self._bind(args, kwargs))

    def call_no_grad(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The eager call without autograd recording: hot entry, else check, route and launch."""
        return self._eager(args, kwargs)

    def _eager(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        # the hot entry of the call's signature when there is one (``find_hot`` spelled out:
        # this is every repeated call's path)
        if self._hot and _forced.get() is None:
            found = self._hot_lookup(args, kwargs)
            if found is not None:
                try:
                    hot = self._hot.get(found[0])
                except TypeError:  # an unhashable argument
                    hot = None
                if hot is not None:
                    result = hot(*found[1])
                    if result is not None:
                        return result
        return self._full_path(args, kwargs)

    def find_hot(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> HotCall | None:
        """The hot entry a call would take, or ``None`` when it has none (or a tuning config is
        forced): ``(key, entry, arguments in params order)``. ``entry(*arguments)`` returns the
        result, or ``None`` where a per-call precondition fails (the full path then decides).
        The key names the call's signature (its form and its arguments' layouts, dtypes,
        devices, kinds of scalars): callers such as ``xkernels.enable()`` remember decisions by it."""
        if not self._hot or _forced.get() is not None:
            return None
        found = self._hot_lookup(args, kwargs)
        if found is None:
            return None
        try:
            hot = self._hot.get(found[0])
        except TypeError:  # an unhashable argument
            return None
        return None if hot is None else (found[0], hot, found[1])

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The call's arguments in ``params`` order; a call that does not fit raises ``check``'s error."""
        canon = self.canonical(args, kwargs)
        if canon is None:
            self.check(*args, **kwargs)  # raises the TypeError naming the argument
            raise TypeError(f"xkernels.ops.{self.name}: arguments do not fit {self.signature()}")
        return canon

    def canonical(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """``(args, kwargs)`` as one tuple in ``params`` order with defaults filled in, or ``None``
        for a call that does not fit the signature (``check`` then raises the TypeError)."""
        n = len(args)
        if not kwargs:
            if self._n_required <= n <= self._n_positional:
                return args + self._defaults[n:]
            return None
        if n > self._n_positional:
            return None
        values = [*args, *self._defaults[n:]]
        index = self._index
        for name, v in kwargs.items():
            i = index.get(name)
            if i is None or i < n:
                return None
            values[i] = v
        for i in range(n, self._n_required):
            if values[i] is REQUIRED:
                return None
        return tuple(values)

    def signature(self) -> str:
        pos = [p.name if p.default is REQUIRED else f"{p.name}={p.default!r}" for p in self.params if p.positional]
        kw = [f"{p.name}={p.default!r}" for p in self.params if not p.positional]
        return f"{self.name}({', '.join(pos + (['*', *kw] if kw else []))})"

    def autograd(self, canon: tuple[Any, ...]) -> torch.Tensor:
        """The call (arguments in ``params`` order) recorded by autograd; see ``ops/autograd.py``."""
        raise NotImplementedError

    def library_call(self, canon: tuple[Any, ...]) -> torch.Tensor:
        """The call (arguments in ``params`` order, ``out`` aside) as its ``torch.ops.xkernels``
        custom op; see ``ops/library.py``."""
        raise NotImplementedError

    def _compiled(self, canon: tuple[Any, ...]) -> torch.Tensor:
        out = canon[self._index["out"]]
        if out is not None and torch.is_grad_enabled() and needs_grad(canon):
            reject_out(self.name, out)
        return library.finish_out(self.name, self.library_call(canon), out)

    def _full_path(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        """Check, route and launch; a kernel call leaves a hot entry for its signature."""
        call = self.check(*args, **kwargs)
        if self.without_backend(call):
            return self.torch_impl(call)
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

    def _hot_lookup(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...]] | None:
        """(hot-entry key, arguments in ``params`` order) of a call, or ``None`` where it cannot
        have an entry. The documented short forms are spelled out for speed: two positional
        tensors; a tensor and a Python number; two tensors and one keyword (``alpha=``,
        ``out=``, ``bias=``, ...). A call with positional arguments only is keyed by those (its
        count implies the defaults of the rest); any other by all of ``params``. Each form's key
        starts with its own tag, so keys of different forms never meet."""
        n = len(args)
        if not kwargs:
            if n == 2:
                a, b = args
                if isinstance(a, torch.Tensor):
                    if isinstance(b, torch.Tensor):
                        return (("2t", _override.get(), a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(),
                                 b.dtype, b.device), args + self._after_two)
                    if type(b) in _NUMBERS:
                        return (("t+n", _override.get(), a.shape, a.stride(), a.dtype, a.device, type(b)),
                                args + self._after_two)
            if not self._n_required <= n <= self._n_positional:
                return None
            values, canon, tag = args, args + self._defaults[n:], n
        else:
            if n == 2 and len(kwargs) == 1:
                a, b = args
                if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                    found = self._one_keyword(a, b, kwargs)
                    if found is not False:
                        return found
            canon = self.canonical(args, kwargs)
            if canon is None:
                return None
            values, tag = canon, "all"
        key = [tag, _override.get()]
        for v, how in zip(values, self._keys):
            if how == "layout":
                key.append((v.shape, v.stride(), v.dtype, v.device) if isinstance(v, torch.Tensor) else type(v))
            elif how == "value":
                key.append(v)
            elif how == "alpha":
                kind = type(v)
                if kind not in _NUMBERS:
                    return None
                key.append((kind, v == 1))
            else:  # "type"
                key.append(type(v))
        return tuple(key), canon

    def _one_keyword(self, a: torch.Tensor, b: torch.Tensor,
                     kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...]] | None | bool:
        """``_hot_lookup`` of ``op(a, b, name=value)``; ``False`` where that is not a complete
        call of the signature (the general path then decides)."""
        (name, v), = kwargs.items()
        form = self._keyword_forms.get(name)
        if form is None:
            return False
        how, before, after = form
        if how == "layout":
            kv = (v.shape, v.stride(), v.dtype, v.device) if isinstance(v, torch.Tensor) else type(v)
        elif how == "alpha":
            kind = type(v)
            if kind not in _NUMBERS:
                return None
            kv = (kind, v == 1)
        elif how == "value":
            kv = v
        else:  # "type"
            kv = type(v)
        return (("2t+kw", _override.get(), name, kv, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(),
                 b.dtype, b.device), (a, b, *before, v, *after))

    def hot_entry(self, *args: Any, **kwargs: Any) -> Callable[..., torch.Tensor | None] | None:
        """The hot entry a call with these arguments would take, if there is one (for tests and
        diagnostics; ``None`` means the call takes the full path)."""
        found = self._hot_lookup(args, kwargs)
        try:
            return None if found is None else self._hot.get(found[0])
        except TypeError:
            return None

    def _remember(self, args: tuple[Any, ...], kwargs: dict[str, Any], plan: Plan, call: Any) -> None:
        found = self._hot_lookup(args, kwargs)
        if found is None:
            return
        key, canon = found
        try:
            if key in self._hot:
                return
        except TypeError:  # an unhashable argument (e.g. an activation given as a list)
            return
        try:
            hot = self.make_hot(plan, call, canon)
        except Exception:  # the call itself succeeded; its repeats keep the full path
            hot = None
        if hot is not None:
            if key[0] == "2t" and not _defaults_are(hot, self._after_two):  # ``__call__`` passes a, b only
                hot = _with_defaults(hot, self._after_two)
            if len(self._hot) >= self.plan_cache_size:
                self._hot.clear()
            self._hot[key] = hot

    def explain(self, *args: Any, **kwargs: Any) -> Explanation:
        """Which backend, route, kernel variant and config a call with these arguments uses."""
        call = self.check(*args, **kwargs)
        if self.without_backend(call):
            return Explanation(self.name, "none", "torch", call.fallback_reason)
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



_NUMBERS = (bool, int, float, complex)


def _defaults_are(fn: Callable[..., Any], defaults: tuple[Any, ...]) -> bool:
    """Whether ``fn(a, b)`` means ``fn(a, b, *defaults)``: the defaults of its parameters 3, 4, ..."""
    code, have = getattr(fn, "__code__", None), getattr(fn, "__defaults__", None) or ()
    if code is None:
        return False
    first = code.co_argcount - len(have)  # the index of the first parameter with a default
    if first > 2:
        return False
    mine = have[2 - first:2 - first + len(defaults)]
    return len(mine) == len(defaults) and all(h is d or (type(h) is type(d) and h == d)
                                              for h, d in zip(mine, defaults))


def _with_defaults(entry: Callable[..., Any], defaults: tuple[Any, ...]) -> Callable[..., Any]:
    """``entry`` callable as ``entry(a, b)`` meaning ``entry(a, b, *defaults)``, and as before with
    every argument; its attributes (``autograd_entry``, ``vendor_blas``) kept."""
    def with_defaults(a: Any, b: Any, *rest: Any) -> Any:
        return entry(a, b, *(rest or defaults))

    with_defaults.__dict__.update(getattr(entry, "__dict__", {}))
    return with_defaults
