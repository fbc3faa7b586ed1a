"""Routes: each way a call of an op can run, as one typed object (see ``docs/front-door.md``).

The full path (``Op._full_path``: check, then ``Op._decide``) takes one of four routes:

* :class:`PluginRoute`: a plugin's :class:`xkernels.OpImpl` for (op, backend) computes it;
* :class:`TorchRoute`: PyTorch computes it (the ``cpu`` backend, fallback dtypes such as float64,
  a call without a tensor operand);
* a plan (``Op.plan``) that runs the op's Triton kernel or the device's BLAS.

A call that ran a plan leaves the route of its signature (``Op.make_hot``), which every later call
with that signature runs without check or planning:

* :class:`KernelRoute`: allocate the result and launch the plan's kernel(s) with the call's tensors;
* :class:`VendorRoute`: PyTorch's own ops (the device's BLAS with a fused epilogue); autograd
  records them: ``autograd_run`` (the unfused composition, which has a derivative) is what the
  front door runs where a gradient is required;
* :class:`AtenRoute`: exactly the aten call (``torch.matmul``, ``F.linear``): ``enable()``'s
  overrides hand such calls to aten's own kernel straight away.

``route.run(*canon)`` takes the call's arguments in the op's ``params`` order (defaults filled in)
and returns the result, or ``None`` where a per-call precondition that the signature does not
fix fails (a data pointer's alignment, ``out=`` partially overlapping an input, torch's TF32
setting changed, a launch hook installed): the front door then takes the full path for that call,
which decides anew (and raises where the call is bad). Nothing is written before ``None``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from xkernels.dispatch import _override
from xkernels.tuning import _forced

Run = Callable[..., "torch.Tensor | None"]


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
    #: where it differs for a call that needs a gradient: how that call runs (``linear``'s
    #: activations whose backward reads the pre-activation)
    training: str | None = None

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
        if self.training:
            lines.append(f"  with a gradient: {self.training}")
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


class Route:
    """One way the calls of one signature run. ``run(*canon)``: see the module doc."""

    kind: ClassVar[str] = ""
    #: ``run`` computes with PyTorch ops that autograd records itself (no ``autograd.Function``):
    #: where a gradient is required the front door runs ``autograd_run``
    records_autograd: ClassVar[bool] = False
    #: ``run`` is exactly the aten call: ``xkernels.enable()``'s overrides call aten for it
    aten_call: ClassVar[bool] = False
    #: a repeat may take this route (it is remembered by signature); False: full path only
    repeats: ClassVar[bool] = True

    __slots__ = ("run", "autograd_run", "detail", "native")

    def __init__(self, run: Run, detail: str = "", autograd_run: Run | None = None) -> None:
        self.run = run
        self.detail = detail
        self.autograd_run = autograd_run if autograd_run is not None else (run if self.records_autograd else None)
        #: canon -> the native front door's description of this route for that call
        #: (``ops/native_front_door.NativeSpec``) or ``None``; ``None``: Python runs every repeat.
        #: A route's ``run`` function carries it as its ``native`` attribute.
        self.native = getattr(run, "native", None)

    def explain(self) -> str:
        """One line: the route's kind and what it runs."""
        return f"{self.kind}: {self.detail}" if self.detail else self.kind

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.explain()}>"


class KernelRoute(Route):
    """The op's Triton kernel(s), launched with the call's tensors (``Launcher.hot``)."""

    kind = "triton kernel"


class VendorRoute(Route):
    """PyTorch's ops on the device's BLAS (a fused epilogue: ``autograd_run`` is the unfused
    composition, the one with a derivative)."""

    kind = "vendor BLAS"
    records_autograd = True


class AtenRoute(VendorRoute):
    """Exactly the aten call; its own derivative is autograd's."""

    aten_call = True


class TorchRoute(Route):
    """PyTorch computes the call (``Op.torch_impl`` of the checked call): ``run(call)``."""

    kind = "torch"
    repeats = False


class PluginRoute(Route):
    """A plugin's implementation, called as the user called the op: ``run(*args, **kwargs)``."""

    kind = "plugin override"
    repeats = False


def check_built(op: str, key: Any, route: Any) -> Route | None:
    """``make_hot``'s answer, checked: a repeatable :class:`Route` or ``None``."""
    if route is None or (isinstance(route, Route) and route.repeats):
        return route
    raise TypeError(f"xkernels.ops.{op}: make_hot must return a KernelRoute, VendorRoute or AtenRoute (or None "
                    f"where the signature has no repeat route), got {route!r} for signature {key}")


class RouteError(RuntimeError):
    """Building a signature's route failed: a bug of the op's ``make_hot``, never a slow path."""


class RouteCache:
    """The routes of one fused module's op call, by signature: its ``forward`` (one call of
    ``op`` with the module's input and parameters) runs the route of a repeat without the op's
    front door (see ``xkernels/nn.py``; ``docs/front-door.md``).

    ``cache.run(key, canon)``: ``canon`` is the op's arguments in ``params`` order; ``key`` must
    determine everything of ``canon`` that the op's own signature key holds: each tensor's shape,
    strides, dtype and device (``None`` for an absent tensor), every other argument's value. The
    cache adds the ``use_backend`` override, and empties itself when the op forgets its routes (a
    plugin registered: ``Op.generation``). A miss, a forced tuning config, or a route declining a
    call (``None``) runs the op's own front door (``op.call_no_grad``), and a miss adopts the route
    that call left. Callers take ``op(...)`` itself where a gradient is required or while
    compiling. Copies and pickles of a module start empty."""

    LIMIT = 64
    #: what ``recorded`` keeps for a signature of an op whose recorded calls leave no route
    #: (``Op.records_leave_routes`` false: gated_linear's training calls plan a kernel that saves
    #: its own activations): its repeats go straight to ``op.autograd``, as ``Op._recorded`` does
    #: after its lookup misses, without two lookups that would miss again. ``run`` treats it as a
    #: miss.
    NO_ROUTE: Any = object()

    __slots__ = ("op", "routes", "generation")

    def __init__(self, op: Any) -> None:
        self.op = op
        self.routes: dict[Any, Route] = {}
        self.generation = op.generation

    def __reduce__(self) -> tuple[Any, ...]:
        return RouteCache, (self.op,)

    def run(self, key: tuple[Any, ...], canon: tuple[Any, ...]) -> torch.Tensor:
        op = self.op
        if _forced.get() is None:
            if op.generation != self.generation:
                self.routes.clear()
                self.generation = op.generation
            key = (_override.get(), key)
            route = self.routes.get(key)
            if route is not None and route is not self.NO_ROUTE:
                result = route.run(*canon)
                if result is not None:
                    return result
            else:
                return self._adopt(key, canon, op.call_no_grad)
        args, kwargs = op.split(canon)
        return op.call_no_grad(*args, **kwargs)

    def _adopt(self, key: tuple[Any, ...], canon: tuple[Any, ...], call: Any, or_none: bool = False) -> torch.Tensor:
        """A miss: ``call`` (the op's front door) runs it, and the route it found or left is kept
        (``or_none``: ``NO_ROUTE`` where it left none)."""
        args, kwargs = self.op.split(canon)
        result = call(*args, **kwargs)
        found = self.op.find_hot(args, kwargs)
        if found is not None or or_none:
            if len(self.routes) >= self.LIMIT:
                self.routes.clear()
            self.routes[key] = self.NO_ROUTE if found is None else found[1]
        return result

    def recorded(self, key: tuple[Any, ...], canon: tuple[Any, ...]) -> torch.Tensor:
        """``run`` for a call where a gradient is required (grad mode on, a tensor requires grad;
        not while compiling): what the op's front door does for it (``Op._recorded``), with the
        route of the signature found by ``key`` instead of the op's own lookup, handed to
        ``op.record``. A miss, or a forced tuning config, calls the op itself, and a
        miss adopts the route that call found or left."""
        op = self.op
        if _forced.get() is None:
            if op.generation != self.generation:
                self.routes.clear()
                self.generation = op.generation
            key = (_override.get(), key)
            route = self.routes.get(key)
            if route is self.NO_ROUTE:
                return op.autograd(canon)
            if route is not None:
                return op.record(route, canon)
            return self._adopt(key, canon, op, or_none=not op.records_leave_routes)
        args, kwargs = op.split(canon)
        return op(*args, **kwargs)
