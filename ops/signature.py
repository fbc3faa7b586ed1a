"""An op's signature: its parameters (``Param``) and what a signature key holds of each argument
(``key_of``); the keys themselves are made by ``Op._lookup`` (``ops/op.py``)."""

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
