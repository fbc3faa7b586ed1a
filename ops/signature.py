"""An op's signature: its parameters (``Param``), what a signature key holds of each argument
(``key_of``) and how a call's arguments bind to the parameters (``Signature``, the base of
``Op``); the keys themselves are made by ``Op._lookup`` (``ops/op.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from xkernels.ops.route import Route

Tensor = torch.Tensor

REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "<required>"})()


@dataclass(frozen=True)
class Param:
    """One parameter of an op's signature. ``key`` says what of its value a signature key holds:
    ``"layout"`` (a tensor's shape, strides, dtype, device; another value's type), ``"value"``
    (the value itself: e.g. ``activation``), ``"alpha"`` (the type and whether it equals 1),
    ``"type"`` (the type: e.g. ``negative_slope``); whatever the key does not hold (scalar values,
    ``alpha``, the slope) is passed to the route with every call and never baked into it."""

    name: str
    default: Any = REQUIRED
    positional: bool = True
    key: str = "layout"



#: ``Op.find_hot``'s answer: (signature key, its route, the call's arguments in ``params`` order:
#: ``route.run(*args)``); a plain tuple, unpacked by its users (a NamedTuple costs ~0.3 us to make)
HotCall = tuple[Any, Route, tuple[Any, ...]]


NUMBERS = (bool, int, float, complex)
NO_KEY: Any = object()  # ``key_of``: the value admits no key (the call has no route)


def key_of(v: Any, how: str) -> Any:
    """What a signature key holds of one argument, by its ``Param.key``; ``NO_KEY`` where none."""
    if how == "layout":
        return (v.shape, v.stride(), v.dtype, v.device) if isinstance(v, Tensor) else type(v)
    if how == "value":
        return v
    if how == "alpha":
        kind = type(v)
        return (kind, v == 1) if kind in NUMBERS else NO_KEY
    return type(v)  # "type"


class Signature:
    """An op's parameters (``name``, ``params``: positional ones first, in order) and how a
    call's arguments bind to them: the tables the key and the binding read, made once."""

    name: str = ""
    params: tuple[Param, ...] = ()

    def __init__(self) -> None:
        self._index = {p.name: i for i, p in enumerate(self.params)}
        self._defaults = tuple(p.default for p in self.params)
        self._n_positional = sum(p.positional for p in self.params)
        self._n_required = sum(p.default is REQUIRED for p in self.params)
        self._keys = tuple(p.key for p in self.params)
        self._after_two = self._defaults[2:]  # the defaults a two-argument call leaves
        # op(a, b, name=value) with every other parameter defaulted: name -> (key kind, the
        # defaults before and after it), for that form's key
        self._keyword_forms = {p.name: (p.key, self._defaults[2:i], self._defaults[i + 1:])
                               for i, p in enumerate(self.params)
                               if i >= 2 and all(j == i for j in range(2, self._n_required))}

    def check(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - the op's
        raise NotImplementedError

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

    def split(self, canon: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``canon`` (arguments in ``params`` order) as a call's (args, kwargs)."""
        n = self._n_positional
        return canon[:n], {p.name: v for p, v in zip(self.params[n:], canon[n:])}

    def signature(self) -> str:
        pos = [p.name if p.default is REQUIRED else f"{p.name}={p.default!r}" for p in self.params if p.positional]
        kw = [f"{p.name}={p.default!r}" for p in self.params if not p.positional]
        return f"{self.name}({', '.join(pos + (['*', *kw] if kw else []))})"
