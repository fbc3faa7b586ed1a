"""Route aten ops of an unmodified model to xkernels: ``enable()``, ``disable()``, ``enabled()``.

    xkernels.enable()                      # add, mm, bmm, addmm on cuda / npu tensors -> xkernels
    with xkernels.enabled(ops=["matmul"]):  # mm and bmm only, for this block
        y = model(x)
    xkernels.routing_counts()              # {'mm': {'xkernels': 24, 'aten: dtype torch.float64': 1}, ...}

How: a ``torch.library.Library("aten", "IMPL")`` per routed aten overload and dispatch key,
registered when an op is turned on and destroyed (which restores aten's own kernel) when it is
turned off (a C++ override keeps the signatures it learnt for the next ``enable()``). The
overrides sit on the backend dispatch keys (``CUDA``; ``PrivateUse1`` for npu; ``CPU`` only when,
at the time of the call that turns routing on, a kernel backend that serves cpu tensors is
forced, e.g. ``use_backend("interpreter")``), i.e. below the Autograd key: aten's own derivative
formulas record the graph and their backward ops are routed too.

Inside an override the xkernels op runs through ``Op.call_no_grad``; a call whose route is the
aten call itself (``Route.aten_call``: xkernels' vendor-BLAS route) goes to aten's ``.out`` kernel straight away,
counted as such. Whatever goes to aten
(float64, mixed dtypes, non-contiguous element-wise operands whose result strides aten derives
from the inputs, ``beta``/``alpha`` of addmm, arguments xkernels' checks refuse, and every aten
call made while an override is already running on this thread) goes to the ``.out`` overload of
the same aten op, whose kernel is never overridden, so a routed call can never recurse.

``aten::linear`` and ``aten::matmul`` are CompositeImplicitAutograd: aten decomposes them into
``addmm`` / ``mm`` / ``bmm`` above the backend keys, so they are routed as those (``ops=["linear"]``
routes ``addmm`` and ``mm``; ``ops=["matmul"]`` routes ``mm`` and ``bmm``). A kernel of their own
on a backend key would take them away from autograd. Where the native extension is loaded,
``ops=["linear"]`` / ``ops=["matmul"]`` also register a C++ kernel of ``aten::linear`` /
``aten::matmul`` on the Autograd key of CUDA / CPU (``backends/native_overrides.h``): a call with
nothing for autograd to record runs aten's decomposition below autograd (the same kernels, its
addmm / mm / bmm still routed, without the autograd layers of each step: less host time than
torch's own call); a linear training call it covers is recorded as one grad_fn
(``xkernels::LinearBackward``, PyTorch's gradients from PyTorch's ATen calls, fewer autograd
nodes for the host); every other call runs aten's composite kernel. Fused activations need
``xkernels.patch``.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from xkernels import dispatch
from xkernels.backend import BackendUnavailableError
from xkernels.ops.native_front_door import ABSENT
from xkernels.registry import registry

__all__ = ["OP_GROUPS", "disable", "enable", "enabled", "enabled_ops", "routing_counts"]

#: User-facing names and the aten overloads each routes.
OP_GROUPS: dict[str, tuple[str, ...]] = {
    "add": ("add.Tensor", "add_.Tensor"),
    "mm": ("mm",),
    "bmm": ("bmm",),
    "addmm": ("addmm",),
    "matmul": ("mm", "bmm", "matmul"),
    "linear": ("addmm", "mm", "linear"),
    "add.Tensor": ("add.Tensor",),
    "add_.Tensor": ("add_.Tensor",),
}
ALL_ATEN = ("add.Tensor", "add_.Tensor", "mm", "bmm", "addmm", "linear", "matmul")
#: aten overloads routed only from C++, on the Autograd key (no Python override: nothing is
#: registered for them while the native extension is not loaded)
NATIVE_ONLY = frozenset({"linear", "matmul"})

_lock = threading.RLock()
_selected: frozenset[str] = frozenset()
_libraries: dict[tuple[str, str], torch.library.Library] = {}
_counts: Counter[tuple[str, str]] = Counter()


class _ThreadState(threading.local):
    inside = False  # an override of this thread is running an xkernels op


_thread = _ThreadState()


# -- public API --------------------------------------------------------------------------------
def enable(ops: Iterable[str] | None = None) -> None:
    """Route these ops (default: all of :data:`OP_GROUPS`) to xkernels from now on, replacing any
    earlier ``enable()`` selection. Calling it twice is harmless."""
    _apply(_resolve(ops))


def disable() -> None:
    """Stop routing; aten's own kernels run again. Without a prior ``enable()`` it does nothing."""
    _apply(frozenset())


@contextlib.contextmanager
def enabled(ops: Iterable[str] | None = None) -> Iterator[None]:
    """Route ``ops`` (default: all) in addition to what is routed already, for this block; the
    routing in effect before the block is restored on exit (nested blocks nest)."""
    wanted = _resolve(ops)
    with _lock:
        before = _selected
        _apply(before | wanted)
    try:
        yield
    finally:
        _apply(before)


def enabled_ops() -> dict[str, list[str]]:
    """The aten overloads routed now, each with the dispatch keys it is registered on."""
    with _lock:
        result: dict[str, list[str]] = {}
        for name, key in sorted(_libraries):
            result.setdefault(name, []).append(key)
        return result


def routing_counts(reset: bool = False) -> dict[str, dict[str, int]]:
    """Calls seen by the overrides: aten overload -> route (``"xkernels"`` or ``"aten: why"``) -> n."""
    with _lock:
        for slot, handle in _natives.items():  # the calls the C++ overrides launched themselves
            _count_native(handle, slot)
        result: dict[str, dict[str, int]] = {}
        for (name, route), n in sorted(_counts.items()):
            result.setdefault(name, {})[route] = n
        if reset:
            _counts.clear()
        return result


# -- registration ------------------------------------------------------------------------------
def _resolve(ops: Iterable[str] | None) -> frozenset[str]:
    if ops is None:
        return frozenset(ALL_ATEN)
    if isinstance(ops, str):
        raise TypeError(f"xkernels.enable: 'ops' must be a list of names, got the string {ops!r}; "
                        f"write ops=[{ops!r}]")
    names = list(ops)
    unknown = [n for n in names if n not in OP_GROUPS]
    if unknown:
        raise ValueError(f"xkernels.enable: unknown op name(s) {unknown}; known: {sorted(OP_GROUPS)}")
    return frozenset(aten for n in names for aten in OP_GROUPS[n])


def dispatch_keys() -> list[str]:
    """The dispatch keys routed now: those of devices whose default backend runs kernels and is
    available here, plus ``CPU`` while a kernel backend for cpu tensors is forced."""
    keys = []
    privateuse1 = torch._C._get_privateuse1_backend_name()
    for backend in registry.backends().values():
        if not (backend.runs_triton and backend.default_for_device) or backend.device_type == "cpu":
            continue
        key = "CUDA" if backend.device_type == "cuda" else "PrivateUse1" if backend.device_type == privateuse1 else None
        if key and key not in keys and backend.is_available():
            keys.append(key)
    forced = dispatch.override_name()
    if forced:
        backend = dispatch.get_backend(forced)
        if backend.runs_triton and backend.device_type == "cpu" and backend.is_available():
            keys.append("CPU")
    return keys


class _NativeOverride:
    """An override registered from C++ (``backends/native_overrides.h``: ``override_op``): a repeated
    signature the Python override handed over is run there without entering Python; the rest
    calls the Python override. ``_destroy`` restores aten's kernel, as a
    ``torch.library.Library``'s does."""

    def __init__(self, handle: Any, slot: tuple[str, str], python_override: Any = None) -> None:
        self.handle, self.slot, self.python_override = handle, slot, python_override

    def _destroy(self) -> None:
        _count_native(self.handle, self.slot)
        self.handle.remove()
        if self.python_override is not None:  # kept with its signatures for the next enable()
            _parked[self.slot] = (self.handle, self.python_override)


#: (aten overload, dispatch key) -> the native override's handle, while registered
_natives: dict[tuple[str, str], Any] = {}
#: the same, for the overrides removed by a disable() (or the end of an ``enabled()`` block): the
#: next enable() registers them again with the signatures they learnt, so a block entered per
#: step does not send each step's first call of every signature back to Python
_parked: dict[tuple[str, str], tuple[Any, Any]] = {}  # -> (handle, the Python override it calls)
NATIVE_KEYS = ("CUDA", "CPU")  # launch records (CUDA), the interpreters' Python launches (CPU: CI runs it)


def _native_override(name: str, key: str) -> Any:
    """The C++ override of ``name`` on ``key`` where the native extension is loaded, else ``None``."""
    from xkernels.backends import native

    mod = native.ready()
    if mod is None or key not in NATIVE_KEYS:
        if mod is None:
            native.module()  # a later enable() finds it built
        return None
    python_override = None
    if name in NATIVE_ONLY:
        handle = mod.override_composite(name, key)
    else:
        python_override = _OVERRIDES[name]
        handle, fn = _parked.pop((name, key), (None, None))
        if handle is not None and fn is python_override:
            handle.reinstall()
        else:
            handle = mod.override_op(name, key, python_override)
    _natives[(name, key)] = handle
    return _NativeOverride(handle, (name, key), python_override)


def _forget_native() -> None:
    """A plugin registered (its tables may change routes): the C++ overrides forget the
    signatures they were handed, as the ops forget their routes."""
    for handle in [*_natives.values(), *(h for h, _ in _parked.values())]:
        handle.clear()


registry.listeners.append(_forget_native)


def _count_native(handle: Any, slot: tuple[str, str]) -> None:
    hits, vendor = handle.take_hits()
    if hits:
        _counts[(slot[0], "xkernels")] += hits
    for why, n in vendor.items():
        _counts[(slot[0], why)] += n


def _apply(selected: frozenset[str]) -> None:
    global _selected
    with _lock:
        keys = dispatch_keys() if selected else []
        wanted = {(name, key) for name in selected for key in keys}
        for slot in [s for s in _libraries if s not in wanted]:
            _libraries.pop(slot)._destroy()  # aten's own kernel is in effect again
            _natives.pop(slot, None)
        for name, key in sorted(wanted - set(_libraries)):
            lib = _native_override(name, key)
            if lib is None and name in NATIVE_ONLY:
                continue  # a later enable() registers it once the extension is loaded
            if lib is None:
                lib = torch.library.Library("aten", "IMPL")
                with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point here
                    warnings.simplefilter("ignore")
                    lib.impl(name, _OVERRIDES[name], key)
            _libraries[(name, key)] = lib
        _selected = selected


# -- the overrides -----------------------------------------------------------------------------
def _kernel_backend(device: torch.device) -> bool:
    try:
        return dispatch.select(device).runs_triton
    except (ValueError, BackendUnavailableError):
        return False


def _run(name: str, fn: Callable[[], torch.Tensor], fallback: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Run the xkernels call ``fn`` with re-entrant aten calls going to aten; arguments that
    xkernels' checks refuse (raised before any kernel runs, nothing written) go to aten."""
    _thread.inside = True
    try:
        result = fn()
    except (ValueError, TypeError) as e:
        _counts[(name, f"aten: xkernels refused ({type(e).__name__})")] += 1
        _thread.inside = False
        return fallback()
    finally:
        _thread.inside = False
    _counts[(name, "xkernels")] += 1
    return result


def _to_aten(name: str, why: str, fallback: Callable[[], torch.Tensor],
             teach: Callable[[str], None] | None = None) -> torch.Tensor:
    """aten's result for a call the override leaves to aten (``why``). ``teach(count)``: hands
    the signature to the C++ override once aten's kernel ran it, so its repeats call aten from
    C++, counted as ``count``; every ``why`` but a re-entrant call is a function of what that
    signature holds."""
    _counts[(name, f"aten: {why}")] += 1
    result = fallback()
    if teach is not None and _natives and why != "re-entrant call":
        teach(f"aten: {why}")
    return result


#: the routing count of a call xkernels would run as the very aten call (its vendor-BLAS route)
VENDOR_WHY = "aten: xkernels' route is the device's BLAS"


def _repeat(name: str, op: Any, args: tuple[Any, ...], aten_out: Callable[[], torch.Tensor],
            fallback: Callable[[], torch.Tensor], aten_args: tuple[torch.Tensor, ...] = ()) -> torch.Tensor | None:
    """A routed call whose signature xkernels has run before (it has a route: the checks of
    ``_matmul_why`` held for these layouts, and the op's own), or ``None``. Where the route is the
    aten call itself (``Route.aten_call``: a vendor-BLAS plan without a fused epilogue) the
    override calls aten's ``.out`` kernel straight away (``aten_out``, counted as ``VENDOR_WHY``)
    instead of running the op, whose aten call would come back through the override."""
    if _thread.inside:
        return None
    found = op.find_hot(args, {})  # as the op's own front door finds it
    if found is None:
        return None
    _, route, canon = found
    if route.aten_call:
        _counts[(name, VENDOR_WHY)] += 1
        _teach_vendor(name, aten_args, VENDOR_WHY)  # its repeats call aten's .out kernel from C++
        return aten_out()

    def call() -> torch.Tensor:
        result = route.run(*canon)  # None where a per-call precondition fails: the full path decides
        if result is None:
            return op.call_no_grad(*args)
        if _natives and route.native is not None:
            _remember_native_route(name, aten_args, route, canon)
        return result

    return _run(name, call, fallback)


def _native_handle(name: str, tensors: Iterable[Any]) -> Any:
    """The C++ override of ``name`` on the dispatch key of a call with these operands (CUDA where
    one is a cuda tensor), or ``None`` (none registered, or a use_backend block open: within one
    the C++ override defers every call to Python)."""
    if not _natives or dispatch._override.get() is not None:
        return None
    ts = [t for t in tensors if isinstance(t, torch.Tensor)]
    key = "CUDA" if any(t.is_cuda for t in ts) else "CPU" if ts and all(t.device.type == "cpu" for t in ts) else ""
    return _natives.get((name, key))


def _teach_vendor(name: str, aten_args: tuple[torch.Tensor, ...], count: str) -> None:
    """mm / bmm (a, b), addmm (bias, a, b): these operands' signature runs aten's .out kernel
    from C++, each call counted as ``count`` (the C++ override takes 2-D mm / addmm operands
    with a 1-D bias and 3-D bmm operands only)."""
    dims = [t.dim() for t in aten_args]
    if dims not in ([2, 2], [3, 3], [1, 2, 2]) or (name == "bmm") != (dims == [3, 3]):
        return
    handle = _native_handle(name, aten_args)
    if handle is not None:
        handle.remember_vendor(list(aten_args), count)


#: per routed matmul overload, the aten argument each of the op's parameters is: mm / bmm (a, b)
#: are matmul's (a, b); addmm (bias, a, b) is linear(a, b.t(), bias), whose weight b.t() shares
#: b's data pointer (a launch reads pointers only)
_ATEN_POSITION = {"mm": {0: 0, 1: 1}, "bmm": {0: 0, 1: 1}, "addmm": {0: 1, 1: 2, 2: 0}}


def _remember_native_route(name: str, aten_args: tuple[torch.Tensor, ...], route: Any,
                           canon: tuple[Any, ...]) -> None:
    """Hands a matmul kernel route's launch to the C++ override of ``name`` on the operands'
    dispatch key, keyed by the aten operands' signature: its repeats launch from C++."""
    handle = _native_handle(name, aten_args)
    spec = None if handle is None else route.native(canon)
    if spec is None or spec.kind != "launch" or spec.out != ABSENT:
        return
    where = _ATEN_POSITION[name]
    if any(i >= 0 and i not in where for i in spec.tensors):
        return
    tensors = tuple(where.get(i, i) for i in spec.tensors)
    handle.remember_route(list(aten_args), tuple(spec._replace(tensors=tensors)))


def _add_why(x: Any, y: Any, alpha: Any) -> str:
    """Why ``add`` of these goes to aten, or "" when xkernels runs it."""
    from xkernels.ops.checks import ELEMENTWISE_KERNEL_DTYPES

    if _thread.inside:
        return "re-entrant call"
    if x.dtype not in ELEMENTWISE_KERNEL_DTYPES:
        return f"dtype {x.dtype}"
    if isinstance(y, torch.Tensor):
        if y.dtype != x.dtype:
            return "mixed dtypes"
        if y.device != x.device:
            return "operands on different devices"
        if not (x.is_contiguous() and y.is_contiguous()):
            return "non-contiguous operand"
    elif isinstance(y, bool) or not isinstance(y, int | float) or torch.result_type(x, y) != x.dtype:
        return "scalar promotes the dtype"
    elif not x.is_contiguous():
        return "non-contiguous operand"
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or (isinstance(alpha, float)
                                                                         and not x.dtype.is_floating_point):
        return "alpha"
    if not _kernel_backend(x.device):
        return "backend runs no kernels"
    return ""


#: signatures (``Op.find_hot`` keys) of add / add_ calls that ``_add_why`` let through and
#: xkernels ran: every condition of ``_add_why`` is a function of what such a key holds (dtypes,
#: devices, shapes and strides, the scalar's type) once ``alpha`` is the default, so a repeat
#: skips it. Bounded like the ops' own entry caches.
_ADD_SIGNATURES: set[Any] = set()
_ADD_SIGNATURES_LIMIT = 1024


def _add_repeat(name: str, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """A repeated default-``alpha`` add whose signature was routed to xkernels before: its hot
    entry's result, or ``None`` (the full override decides)."""
    if _thread.inside:
        return None
    found = op.find_hot(args, kwargs)
    if found is None or found[0] not in _ADD_SIGNATURES:
        return None
    _, route, canon = found
    _thread.inside = True
    try:
        result = route.run(*canon)
    finally:
        _thread.inside = False
    if result is not None:
        _counts[(name, "xkernels")] += 1
        _teach_add(name, args, 1, route, canon)  # the C++ override missed it (registered since): teach it
    return result


def _remember_add(name: str, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  result: torch.Tensor) -> torch.Tensor:
    """``result``, once the signature xkernels just ran (with the route it left) is remembered:
    by the Python repeat (default ``alpha``) and by the C++ override."""
    found = op.find_hot(args, kwargs)
    if found is not None:
        alpha = kwargs.get("alpha", 1)
        if alpha.__class__ is int and alpha == 1:
            if len(_ADD_SIGNATURES) >= _ADD_SIGNATURES_LIMIT:
                _ADD_SIGNATURES.clear()
            _ADD_SIGNATURES.add(found[0])
        _teach_add(name, args, alpha, found[1], found[2])
    return result


_NUMBERS = (bool, int, float, complex)


def _teach_add(name: str, args: tuple[Any, ...], alpha: Any, route: Any = None, canon: Any = None,
               count: str = "") -> None:
    """Hands add / add_ (``args`` = (self, other)) with this ``alpha`` to the C++ override of
    ``name`` on the operands' dispatch key: its repeats run ``route``'s launch there (where the
    route has a native form), or without a route aten's own kernel (the Python override's
    decision for the signature; its calls counted as ``count``). The C++ key holds what decides
    both: each operand's dtype, device, sizes and strides, a number operand's kind and value,
    ``alpha``'s kind and value."""
    x, y = args
    if not (isinstance(x, torch.Tensor) and (isinstance(y, torch.Tensor) or y.__class__ in _NUMBERS)
            and alpha.__class__ in _NUMBERS):
        return
    handle = _native_handle(name, args)
    if handle is None:
        return
    spec = None
    if route is not None:
        spec = None if route.native is None else route.native(canon)
        if spec is None or spec.kind != "launch":
            return
    handle.remember_add(x, y, alpha, None if spec is None else tuple(spec), count)


def _add(x: torch.Tensor, y: Any, *, alpha: Any = 1) -> torch.Tensor:
    from xkernels.ops.elementwise.add import add

    default_alpha = alpha.__class__ is int and alpha == 1
    if default_alpha:
        done = _add_repeat("add.Tensor", add, (x, y), {})
        if done is not None:
            return done

    def fallback() -> torch.Tensor:
        dev = y.device if isinstance(y, torch.Tensor) and x.dim() == 0 and x.device.type == "cpu" else x.device
        return torch.ops.aten.add.out(x, y, alpha=alpha, out=torch.empty(0, dtype=torch.result_type(x, y), device=dev))

    why = _add_why(x, y, alpha)
    if why:
        return _to_aten("add.Tensor", why, fallback, lambda c: _teach_add("add.Tensor", (x, y), alpha, count=c))
    kwargs = {} if default_alpha else {"alpha": alpha}
    return _run("add.Tensor", lambda: _remember_add("add.Tensor", add, (x, y), kwargs,
                                                    add.call_no_grad(x, y, **kwargs)), fallback)


def _add_(x: torch.Tensor, y: Any, *, alpha: Any = 1) -> torch.Tensor:
    from xkernels.ops.elementwise.add import add

    default_alpha = alpha.__class__ is int and alpha == 1
    if default_alpha:
        done = _add_repeat("add_.Tensor", add, (x, y), {"out": x})
        if done is not None:
            return done

    def fallback() -> torch.Tensor:
        shape = torch.broadcast_shapes(x.shape, y.shape if isinstance(y, torch.Tensor) else ())
        if shape != x.shape:  # add.out would resize x; add_ refuses
            raise RuntimeError(f"output with shape {list(x.shape)} doesn't match the broadcast shape {list(shape)}")
        return torch.ops.aten.add.out(x, y, alpha=alpha, out=x)

    why = _add_why(x, y, alpha)
    if not why and isinstance(y, torch.Tensor) and torch.broadcast_shapes(x.shape, y.shape) != x.shape:
        why = "broadcast grows self"
    if why:
        return _to_aten("add_.Tensor", why, fallback, lambda c: _teach_add("add_.Tensor", (x, y), alpha, count=c))
    kwargs = {"out": x} if default_alpha else {"out": x, "alpha": alpha}
    return _run("add_.Tensor", lambda: _remember_add("add_.Tensor", add, (x, y), kwargs,
                                                     add.call_no_grad(x, y, **kwargs)), fallback)


def _matmul_why(a: torch.Tensor, b: torch.Tensor, dims: int) -> str:
    from xkernels.ops.checks import MATMUL_KERNEL_DTYPES

    if _thread.inside:
        return "re-entrant call"
    if a.dim() != dims or b.dim() != dims:
        return f"operands are not {dims}-D"
    if a.dtype != b.dtype:
        return "mixed dtypes"
    if a.dtype not in MATMUL_KERNEL_DTYPES:
        return f"dtype {a.dtype}"
    if a.device != b.device:
        return "operands on different devices"
    if a.shape[-1] != b.shape[-2] or (dims == 3 and a.shape[0] != b.shape[0]):
        return "shapes do not match"
    if not _kernel_backend(a.device):
        return "backend runs no kernels"
    return ""


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from xkernels.ops.matmul import matmul

    fallback = lambda: torch.ops.aten.mm.out(a, b, out=torch.empty(0, dtype=a.dtype, device=a.device))
    if a.dim() == 2 == b.dim():
        done = _repeat("mm", matmul, (a, b), lambda: torch.mm(a, b, out=a.new_empty((a.shape[0], b.shape[1]))),
                       fallback, (a, b))
        if done is not None:
            return done
    why = _matmul_why(a, b, 2)
    if why:
        return _to_aten("mm", why, fallback, lambda c: _teach_vendor("mm", (a, b), c))
    return _run("mm", lambda: matmul.call_no_grad(a, b), fallback)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from xkernels.ops.matmul import matmul

    fallback = lambda: torch.ops.aten.bmm.out(a, b, out=torch.empty(0, dtype=a.dtype, device=a.device))
    if a.dim() == 3 == b.dim():
        done = _repeat("bmm", matmul, (a, b),
                       lambda: torch.bmm(a, b, out=a.new_empty((a.shape[0], a.shape[1], b.shape[2]))), fallback,
                       (a, b))
        if done is not None:
            return done
    why = _matmul_why(a, b, 3)
    if why:
        return _to_aten("bmm", why, fallback, lambda c: _teach_vendor("bmm", (a, b), c))
    return _run("bmm", lambda: matmul.call_no_grad(a, b), fallback)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    from xkernels.ops.matmul import linear

    fallback = lambda: torch.ops.aten.addmm.out(bias, a, b, beta=beta, alpha=alpha,
                                                out=torch.empty(0, dtype=a.dtype, device=a.device))
    if beta == 1 and alpha == 1 and a.dim() == 2 == b.dim() and bias.dim() == 1:
        done = _repeat("addmm", linear, (a, b.t(), bias),
                       lambda: torch.addmm(bias, a, b, out=a.new_empty((a.shape[0], b.shape[1]))), fallback,
                       (bias, a, b))
        if done is not None:
            return done
    why = _matmul_why(a, b, 2)
    if not why:
        if beta != 1 or alpha != 1:
            why = "beta or alpha is not 1"
        elif bias.dim() != 1 or bias.shape[0] != b.shape[1] or bias.dtype != a.dtype or bias.device != a.device:
            why = "self is not a bias of shape (N,)"
    if why:
        plain = beta.__class__ is int and beta == 1 and alpha.__class__ is int and alpha == 1
        return _to_aten("addmm", why, fallback, (lambda c: _teach_vendor("addmm", (bias, a, b), c)) if plain else None)
    return _run("addmm", lambda: linear.call_no_grad(a, b.t(), bias), fallback)


_OVERRIDES: dict[str, Callable[..., torch.Tensor]] = {
    "add.Tensor": _add,
    "add_.Tensor": _add_,
    "mm": _mm,
    "bmm": _bmm,
    "addmm": _addmm,
}
