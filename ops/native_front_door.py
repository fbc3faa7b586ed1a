"""The native front door: an op's repeated calls keyed, looked up and run in C++.

A route's Python ``run`` costs the host, per call, the signature key (a dozen tensor getters and
a tuple hash), the route's frame and the allocation's Python call: on an H100 host that put
``linear(x, w, b)`` at 20.5 µs against ``F.linear``'s 15.6 (results/2026-11-25-h100-native-overrides).
Where the native extension is loaded (``backends/native.py``), every op has a ``RouteTable``
(``backends/native_route.h``): ``Op.__call__`` calls it first with the call's own arguments; it
builds the key from the tensors' internals, finds the route and runs it (allocate, launch a
packed record or call the BLAS), or answers ``None`` and the Python front door goes on as before.

What the table holds is taught by the Python front door: a route that describes itself
(``Route.native``: canon -> :class:`NativeSpec`) is put in the table under the key of the call
that ran it (``teach``), when the route is made and whenever a Python lookup finds one the table
lacks (a route made before the extension loaded, another scalar value). The C++ key holds
everything the Python signature key holds and more (the call's form with its keyword names, the
``use_backend`` override, each tensor's dtype, device, layout, sizes and strides, a number's or
string's exact value), so a route is only ever run for calls its Python route would run. The
table declines (``None``) where Python decides per call: grad mode with a tensor requiring
grad, a forced tuning config, a torch function or dispatch mode, a tensor subclass, a launch hook
installed, a misaligned pointer, a tensor on another device than the current one, ``out=``
partly overlapping an input. ``XKERNELS_NATIVE=0`` turns it off with the rest of the extension.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from xkernels import dispatch, tuning
from xkernels.backends import native

#: a route's tensor that is the call's result
RESULT = -1
#: a parameter the route does not take (linear without a bias)
ABSENT = -2


class NativeSpec(NamedTuple):
    """What the native front door runs for a route's repeats (``backends/native_route.h``).

    ``kind``: ``"launch"`` (allocate the result, or take the ``out`` parameter's tensor, and launch
    ``launch`` with ``tensors``), ``"linear"`` (``F.linear`` on the BLAS: ``tensors`` = (x, weight,
    bias or ``ABSENT``)), ``"matmul"`` (``torch.matmul`` of 2-D or equal-batch 3-D operands:
    ``tensors`` = (a, b)) or ``"torch_linear"`` (a training call, with autograd: ``F.linear`` and
    PyTorch's activation, as ``tensors`` = (x, weight, bias or ``ABSENT``); keyed with its tensors
    that require grad, and the only kind run for such a call). ``tensors`` are parameter indices in
    the op's ``params`` order, ``RESULT`` for the result; ``size``/``stride``/``dtype`` the
    result's; ``overlap``: per input that may alias ``out``, (parameter, extent in bytes, same
    layout as ``out``), checked against ``out_extent`` as the op's check does. ``linear`` then
    applies ``activation`` (``slope``: leaky_relu's) as PyTorch's op in place, or with ``epilogue``
    in the BLAS epilogue (``torch._addmm_activation``: relu, gelu_tanh; a bias is required)."""

    kind: str
    launch: Any = None
    tensors: tuple[int, ...] = ()
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    dtype: torch.dtype | None = None
    out: int = ABSENT
    overlap: tuple[tuple[int, int, bool], ...] = ()
    out_extent: int = 0
    activation: str | None = None
    slope: float = 0.01
    epilogue: bool = False


def launch_how(launch: Any, device: torch.device) -> Any:
    """What the native code launches with for ``launch`` (a ``Launcher.hot`` function) on the
    backend of ``device``: a record's spec, an interpreter's launch function, or ``None``."""
    if launch is None:
        return None
    return native.launch_spec(launch, dispatch.select(device).name)


def kernel_spec(launch: Any, device: torch.device, tensors: tuple[int, ...], size: tuple[int, ...],
                stride: tuple[int, ...], dtype: torch.dtype) -> NativeSpec | None:
    """A ``"launch"`` spec allocating a ``size``/``stride``/``dtype`` result, or ``None`` where
    ``launch`` has no native form."""
    how = launch_how(launch, device)
    if how is None:
        return None
    return NativeSpec("launch", how, tensors, tuple(size), tuple(stride), dtype)


def teach(table: Any, args: tuple[Any, ...], kwargs: dict[str, Any], route: Any, canon: tuple[Any, ...]) -> None:
    """Put ``route`` (which just ran the call ``args, kwargs``; ``canon``: its arguments in
    ``params`` order) into ``table`` under that call's key, if it describes itself natively."""
    spec = route.native(canon)
    if spec is not None:
        table.put(args, kwargs, tuple(spec))


def teach_torch_linear(table: Any, args: tuple[Any, ...], kwargs: dict[str, Any], has_bias: bool,
                       activation: str | None, negative_slope: float) -> None:
    """Put a ``"torch_linear"`` route into ``linear``'s ``table`` for the training call ``args,
    kwargs`` (x, weight, bias, activation[, negative_slope=]), which xkernels gives PyTorch's own
    ops (``xkernels.nn``'s training policy): its repeats run ``F.linear`` and the activation
    from C++, recorded by autograd as in Python. The key holds everything the policy reads."""
    table.put(args, kwargs, tuple(NativeSpec("torch_linear", tensors=(0, 1, 2 if has_bias else ABSENT),
                                             activation=activation, slope=float(negative_slope))))


_prepared: set[int] = set()


def new_table(mod: Any, params: tuple[str, ...], autocast_declines: bool = False) -> Any:
    """A ``RouteTable`` of the loaded extension ``mod`` for an op with these parameter names (the
    first table hands the extension the context variables its key reads); ``autocast_declines``:
    the table declines a call while autocast would cast one of its tensors (an op whose operands
    autocast casts, ``Op.autocast_params``: the Python front door casts them first; the cast
    call's repeats are the table's again)."""
    if id(mod) not in _prepared:
        mod.set_context_vars(dispatch._override, tuning._forced)
        _prepared.add(id(mod))
    return mod.RouteTable(params, autocast_declines)
