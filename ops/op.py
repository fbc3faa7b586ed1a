"""The op front door shared by every op: validate, pick the backend, then route the call.

``op(*args, **kwargs)`` (``Op.__call__``):

0. where the native extension is loaded, a repeat its route table holds runs from C: the class's
   call slot (``backends/native_call.h``) calls the table first; what it declines comes here;
1. while ``torch.compile``/``torch.export`` trace (``torch.compiler.is_compiling()``): the
   registered custom op ``torch.ops.xkernels.<op>`` (``op.library_call``, ``ops/library.py``);
2. grad mode on and a tensor argument requiring grad (``_recorded``): a signature whose route
   records autograd itself (``Route.records_autograd``: PyTorch's own ops) runs its
   ``autograd_run``; any other call goes through the op's ``autograd.Function`` (``op.autograd``,
   ``ops/autograd.py``), whose forward is ``call_no_grad``;
3. else (``_eager``, also ``call_no_grad``): the route of the call's signature, if it has one
   (``_lookup``), else the full path (``_full_path``).

The full path checks the call, then decides its route (``_decide``, which ``explain`` reports
too) on backend ``b``: a plugin's :class:`xkernels.OpImpl` for (op, ``b.name``); the op's Triton
kernel if ``b.runs_triton`` and the dtypes are kernel dtypes (a plan: ``Op.plan``; the plan may be
the device's BLAS); else PyTorch. A call that ran a plan leaves the route of its signature
(``make_hot``: a :class:`KernelRoute`, :class:`VendorRoute` or :class:`AtenRoute`,
``ops/route.py``) that every later call with that signature runs.

The signature key (``_lookup``, the one place keys are made): the call's form (two tensors; a
tensor and a Python number; two tensors and one keyword; positional only; anything else bound to
``params``) and per parameter (``Param.key``) each tensor's shape, strides, dtype and device, a
Python number's type, ``alpha``'s type and whether it is 1, ``activation``'s value; plus the
``use_backend`` override in effect. Everything ``check`` and the routing decided is a function of
it. Routes are not made or used while a tuning config is forced, and are dropped when a plugin
registers. See ``docs/front-door.md``.

Threads. Calls from many threads at once are safe: the backend override and a forced config are
context-local (``use_backend``, ``tuning.force``); a plan is made (and its bucket autotuned or
checked on first use) by one thread at a time per op (``_plan_lock``; a thread finding the plan
made meanwhile takes it); the caches are dicts whose single operations the interpreter lock makes
atomic; and a backend whose kernels cannot run concurrently serializes its launches itself (the
interpreter backends).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from xkernels import dispatch, tuning
from xkernels.backend import Backend
from xkernels.backends import native
from xkernels.dispatch import _override
from xkernels.ops import autocast, library, native_front_door
from xkernels.ops.autocast import autocasting
from xkernels.ops.autograd import needs_grad, reject_out
from xkernels.ops.route import (
    AtenRoute,
    Explanation,
    KernelRoute,
    Plan,
    PluginRoute,
    Route,
    RouteError,
    TorchRoute,
    VendorRoute,
    check_built,
)
from xkernels.ops.signature import NO_KEY, NUMBERS, HotCall, Param, Signature, key_of
from xkernels.registry import registry
from xkernels.tuning import _forced

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_grad_enabled = torch.is_grad_enabled


#: ``torch.cuda.is_current_stream_capturing``'s C function (one Python frame less per call)
_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing


def _capturing(t: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream while ``t`` is on a CUDA
    device: the call's host cost is then paid once, at capture, not at each replay."""
    return t.is_cuda and _stream_capturing()


Tensor = torch.Tensor
#: whether any tensor among the arguments requires grad (PyTorch's C helper where it has one)
_any_requires_grad = getattr(torch._C, "_any_requires_grad", None) or (lambda *values: needs_grad(values))

__all__ = ["AtenRoute", "Explanation", "HotCall", "KernelRoute", "Op", "Param", "Plan", "Route", "RouteError",
           "TorchRoute", "VendorRoute"]


#: Every op object made, by name, in the order they were made (the compile check walks them).
REGISTERED: dict[str, Op] = {}


def _attach_native(mod: Any) -> None:
    """The native extension loaded: every op made so far gets its route table (later ones get
    theirs in ``Op.__init__``)."""
    for op in list(REGISTERED.values()):
        op.attach_native(mod)


native.on_load.append(_attach_native)


class Op(Signature):
    """Base class of the public ops. A subclass declares ``name`` and ``params`` (positional
    parameters first, in order) and implements ``check`` (validate; the call record),
    ``torch_impl``, ``plan_key``/``make_plan``/``run_plan`` (the kernel route's first call),
    ``make_hot`` (the route of its repeats), ``autograd`` and ``library_call``."""

    plan_cache_size = 512
    #: whether a recorded call (``autograd``) leaves its signature the route that later lookups
    #: find (its forward runs ``call_no_grad``); false where the forward plans its own kernel
    #: (gated_linear saves gate and up): a module's ``RouteCache`` then remembers the miss
    records_leave_routes = True
    #: the parameters cast to the autocast dtype while autocast is on (``ops/autocast.py``): the
    #: GEMM operands of the matmul-like ops; none for the others
    autocast_params: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()  # the parameter tables (Signature)
        self._plans: OrderedDict[Any, Plan] = OrderedDict()
        self._hot: dict[Any, Route] = {}  # signature key -> the route of its repeats
        self._ready: set[str] = set()
        self._plan_lock = threading.RLock()  # re-entrant: making a plan may call the op (autotune)
        REGISTERED.setdefault(self.name, self)
        self.generation = 0  # counts ``_forget``s: a cache of this op's routes (xkernels.nn) checks it
        self._torch_route = TorchRoute(lambda call: self.torch_impl(call))
        # the native front door's table of this op's routes (ops/native_front_door.py), once loaded
        self._native: Any = None
        loaded = native.ready()
        if loaded is not None:
            self.attach_native(loaded)
        # a plugin registered later may add tuning tables or replace a backend: plan again
        registry.listeners.append(self._forget)

    def attach_native(self, mod: Any) -> None:
        """Give this op a native route table (``ops/native_front_door.py``), once, and its class
        the call slot that runs the table from C (``backends/native_call.h``: a repeat then costs
        no Python frame), where the class's ``__call__`` is this one."""
        if self._native is None and REGISTERED.get(self.name) is self:
            self._native = native_front_door.new_table(mod, tuple(p.name for p in self.params),
                                                       bool(self.autocast_params))
            if type(self).__call__ is Op.__call__:
                mod.install_op_call(type(self))

    def _restore_call_slot(self) -> None:
        """Install the class's C call slot again where its ``__call__`` is ``Op.__call__`` (CPython
        recomputes a class's slot when its ``__call__`` is assigned or deleted)."""
        mod = native.ready()
        if mod is not None and type(self).__call__ is Op.__call__ and REGISTERED.get(self.name) is self:
            mod.install_op_call(type(self))

    def _forget(self) -> None:
        self._plans.clear()
        self._hot.clear()
        self._ready.clear()
        if self._native is not None:
            self._native.clear()
        self.generation += 1

    def __reduce__(self) -> str:
        return self.name  # an op pickles as its module-level instance (``linear`` of ops/matmul/ops.py)

    # -- subclass interface -------------------------------------------------------------------
    def check(self, *args: Any, **kwargs: Any) -> Any:
        """Validate arguments; return a call record with ``.device``, ``.kernel_ok`` and
        ``.fallback_reason``."""
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

    def make_hot(self, plan: Plan, call: Any, canon: tuple[Any, ...]) -> Route | None:
        """The route of this call's signature, for its repeats (``canon``: this call's arguments in
        ``params`` order, as ``route.run`` will take every repeat's): a :class:`KernelRoute`,
        :class:`VendorRoute` or :class:`AtenRoute`, or ``None`` where this signature has no
        repeat route (its repeats keep the full path; e.g. ``out=`` of matmul). Called right after
        ``run_plan`` ran this call. An exception here is a bug: it propagates as a
        :class:`RouteError` naming the op and the signature."""
        return None

    # -- the call -------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Run the op: see the module doc."""
        if _is_compiling():
            if self.autocast_params and autocasting():  # the custom op gets no cast of its own
                args, kwargs = autocast.cast_args(self, args, kwargs)
            return self._compiled(self._bind(args, kwargs))
        table = self._native
        if table is not None:  # a repeat run in C++ (ops/native_front_door.py), else None
            result = table(*args, **kwargs)
            if result is not None:
                # a repeat the class's C call slot would have run: the slot is gone (the class's
                # __call__ was set and restored, e.g. a spy): put it back
                self._restore_call_slot()
                return result
        if self.autocast_params and autocasting():  # the table declined: the operands in the autocast dtype
            args, kwargs = autocast.cast_args(self, args, kwargs)
        if _grad_enabled() and (_any_requires_grad(*args, *kwargs.values()) if kwargs else _any_requires_grad(*args)):
            return self._recorded(args, kwargs)
        if self._hot and _forced.get() is None:  # ``_eager``, one frame less: every repeat comes here
            _, route, canon = self._lookup(args, kwargs)
            if route is not None:
                result = route.run(*canon)
                if result is not None:
                    if table is not None and route.native is not None:  # the table lacks it: teach it
                        native_front_door.teach(table, args, kwargs, route, canon)
                    return result
        return self._full_path(args, kwargs)

    def call_no_grad(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The eager call without autograd recording: the signature's route, else the full path."""
        return self._eager(args, kwargs)

    def _eager(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        if self.autocast_params and autocasting():
            args, kwargs = autocast.cast_args(self, args, kwargs)
        table = self._native
        if table is not None:
            result = table(*args, **kwargs)
            if result is not None:
                return result
        if self._hot and _forced.get() is None:
            _, route, canon = self._lookup(args, kwargs)
            if route is not None:
                result = route.run(*canon)
                if result is not None:  # None: a per-call precondition failed (ops/route.py)
                    if table is not None and route.native is not None:
                        native_front_door.teach(table, args, kwargs, route, canon)
                    return result
        return self._full_path(args, kwargs)

    def _recorded(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        """A call with a tensor requiring grad (grad mode on), recorded by autograd: the
        signature's route where it records autograd itself (PyTorch's ops; aten's backward),
        else the op's ``autograd.Function``."""
        found = self.find_hot(args, kwargs)
        if found is None:
            return self.autograd(self._bind(args, kwargs))
        return self.record(found[1], found[2])  # canon: the arguments in ``params`` order, as ``_bind`` gives them

    def record(self, route: Route, canon: tuple[Any, ...]) -> Any:
        """``_recorded`` of a call whose signature has ``route`` (``canon``: its arguments in
        ``params`` order); also what a module's ``RouteCache.recorded`` runs on a hit. A route
        that records autograd runs its ``autograd_run``; any other goes into ``autograd(canon,
        route)``, whose forward runs it without looking it up again."""
        if route.records_autograd:
            return route.autograd_run(*canon)
        return self.autograd(canon, route)

    def _full_path(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        """Check, decide the route and run it; a plan's call leaves its signature's route."""
        call = self.check(*args, **kwargs)
        route = self._decide(call)[1]
        if isinstance(route, TorchRoute):
            return route.run(call)
        if isinstance(route, PluginRoute):
            return route.run(*args, **kwargs)
        result = self.run_plan(route, call)
        if _forced.get() is None:
            self._remember(args, kwargs, route, call)
        return result

    def _decide(self, call: Any, explaining: bool = False) -> tuple[Backend | None, Route | Plan]:
        """The route of a checked call, the one decision ``_full_path`` runs and ``explain``
        reports: (backend, ``PluginRoute`` | ``TorchRoute`` | the plan). ``explaining``: plan
        without caching or tuning, reasons spelled out."""
        if self.without_backend(call):
            return None, TorchRoute(self._torch_route.run, call.fallback_reason)
        backend = dispatch.select(call.device) if explaining else self._backend(call)
        impl = registry.op_impl(self.name, backend.name)
        if impl is not None:
            fn = impl.fn
            return backend, PluginRoute(fn, f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)} "
                                            f"is registered for ({self.name!r}, {backend.name!r}) {impl.note}".strip())
        if not backend.runs_triton or not call.kernel_ok:
            if not explaining:
                return backend, self._torch_route
            why = call.fallback_reason if backend.runs_triton else f"backend {backend.name!r} runs PyTorch"
            return backend, TorchRoute(self._torch_route.run, why)
        return backend, self.make_plan(call, backend) if explaining else self.plan(call, backend)

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

    # -- signatures and their routes -------------------------------------------------------------
    def _lookup(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Route | None, Any]:
        """(signature key, its route or ``None``, the arguments in ``params`` order) of a call;
        ``(None, None, None)`` where the call cannot have a route. The one place keys are made
        (``__call__``, ``find_hot``, ``hot_entry`` and ``_remember`` all come here). Each form's key
        starts with its own tag, so keys of different forms never meet."""
        n = len(args)
        if not kwargs:
            if n == 2:
                a, b = args
                if isinstance(a, Tensor):
                    if isinstance(b, Tensor):
                        key = ("2t", _override.get(), a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(),
                               b.dtype, b.device)
                        return key, self._hot.get(key), args + self._after_two
                    if type(b) in NUMBERS:
                        key = ("t+n", _override.get(), a.shape, a.stride(), a.dtype, a.device, type(b))
                        return key, self._hot.get(key), args + self._after_two
            if not self._n_required <= n <= self._n_positional:
                return _MISS
            values, canon, tag = args, args + self._defaults[n:], n
        else:
            if n == 2 and len(kwargs) == 1 and isinstance(args[0], Tensor) and isinstance(args[1], Tensor):
                (name, v), = kwargs.items()
                form = self._keyword_forms.get(name)
                if form is not None:  # op(a, b, name=value), every other parameter defaulted
                    how, before, after = form
                    kv = key_of(v, how)
                    if kv is NO_KEY:
                        return _MISS
                    a, b = args
                    key = ("2t+kw", _override.get(), name, kv, a.shape, a.stride(), a.dtype, a.device, b.shape,
                           b.stride(), b.dtype, b.device)
                    try:
                        return key, self._hot.get(key), (a, b, *before, v, *after)
                    except TypeError:  # an unhashable value (an activation given as a list): no route
                        return _MISS
            canon = self.canonical(args, kwargs)
            if canon is None:
                return _MISS
            values, tag = canon, "all"
        key = [tag, _override.get()]
        for v, how in zip(values, self._keys):
            kv = (v.shape, v.stride(), v.dtype, v.device) if how == "layout" and isinstance(v, Tensor) else \
                key_of(v, how)
            if kv is NO_KEY:
                return _MISS
            key.append(kv)
        key = tuple(key)
        try:
            return key, self._hot.get(key), canon
        except TypeError:  # an unhashable value in the key: no route
            return _MISS

    def _remember(self, args: tuple[Any, ...], kwargs: dict[str, Any], plan: Plan, call: Any) -> None:
        """Build and keep the route of the call's signature (``make_hot``), if it has none yet."""
        key, route, canon = self._lookup(args, kwargs)
        if key is None or route is not None:
            return
        try:
            built = self.make_hot(plan, call, canon)
        except Exception as e:
            raise RouteError(f"xkernels.ops.{self.name}: building the route of signature {key} failed "
                             f"({type(e).__name__}: {e}); {type(self).__name__}.make_hot has a bug") from e
        route = check_built(self.name, key, built)
        if route is not None:
            if len(self._hot) >= self.plan_cache_size:
                self._hot.clear()
            self._hot[key] = route
            if self._native is not None:
                if route.native is not None:
                    native_front_door.teach(self._native, args, kwargs, route, canon)
            elif route.native is not None:
                native.module()  # the first route with a native form starts the extension's build (background)

    def find_hot(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> HotCall | None:
        """The route a call would take without check or planning, or ``None`` when it has none (or
        a tuning config is forced). ``(key, route, args) = found``; ``route.run(*args)`` runs it (``None``: take the
        full path, ``ops/route.py``). The key names the call's signature: callers such as
        ``xkernels.enable()`` remember decisions by it."""
        if not self._hot or _forced.get() is not None:
            return None
        key, route, canon = self._lookup(args, kwargs)
        return None if route is None else (key, route, canon)

    def repeat_route(self, *args: Any, **kwargs: Any) -> Route | None:
        """The route a call with these arguments would repeat by (``None``: the full path)."""
        return self._lookup(args, kwargs)[1]

    def hot_entry(self, *args: Any, **kwargs: Any) -> Any:
        """``repeat_route(...).run`` (the function a repeat runs), or ``None``."""
        route = self._lookup(args, kwargs)[1]
        return None if route is None else route.run

    def autograd(self, canon: tuple[Any, ...], route: Route | None = None) -> torch.Tensor:
        """The call (arguments in ``params`` order) recorded by autograd; see ``ops/autograd.py``.
        ``route``: the route of ``canon``'s signature where the caller found one (it does not
        record autograd itself); the forward may run it (``forward_of``) instead of looking it up
        again through ``call_no_grad``."""
        raise NotImplementedError

    def forward_of(self, route: Route | None, canon: tuple[Any, ...], positions: tuple[int, ...],
                   fallback: Any) -> Any:
        """The no-grad forward an ``autograd.Function`` calls with the tensors at ``positions`` of
        ``canon``: ``route.run`` with those tensors put into ``canon`` (``route`` is the route of
        ``canon``'s signature, and the Function's forward receives tensors of that signature), or
        ``fallback`` (``call_no_grad``) where there is no route or it declines the call (``None``)."""
        if route is None:
            return fallback
        run = route.run

        def forward(*tensors: Any) -> torch.Tensor:
            full = list(canon)
            for p, t in zip(positions, tensors):
                full[p] = t
            result = run(*full)
            return result if result is not None else fallback(*tensors)

        return forward

    def library_call(self, canon: tuple[Any, ...]) -> torch.Tensor:
        """The call (arguments in ``params`` order, ``out`` aside) as its ``torch.ops.xkernels``
        custom op; see ``ops/library.py``."""
        raise NotImplementedError

    def _compiled(self, canon: tuple[Any, ...]) -> torch.Tensor:
        out = canon[self._index["out"]]
        if out is not None and torch.is_grad_enabled() and needs_grad(canon):
            reject_out(self.name, out)
        return library.finish_out(self.name, self.library_call(canon), out)

    def explain(self, *args: Any, **kwargs: Any) -> Explanation:
        """Which backend, route, kernel variant and config a call with these arguments uses."""
        call = self.check(*args, **kwargs)
        backend, route = self._decide(call, explaining=True)
        if backend is None:
            return Explanation(self.name, "none", "torch", call.fallback_reason)
        how = "by override" if dispatch.override_name() else f"tensors are on {call.device.type}"
        if isinstance(route, Route):
            return Explanation(self.name, backend.name, route.kind, f"{how}; {route.detail}")
        return Explanation(self.name, backend.name, route.route, how, route.variant, dict(route.config),
                           route.source, route.programs, route.tiles, route.why or None)


_MISS = (None, None, None)  # ``_lookup`` of a call that cannot have a route
