"""Hook specifications: the whole surface a backend plugin can implement.

A plugin is a module (or object) with functions marked ``@xkernels.hookimpl`` whose names match
the specs below, exposed through the ``xkernels.backends`` entry-point group::

    [project.entry-points."xkernels.backends"]
    mydev = "mydev_xkernels.plugin"

The four built-in backends (cpu, cuda, npu, interpreter) are registered through that same group,
so they are examples of everything here. Every hook is optional; each returns a sequence and
pluggy collects the sequences of all plugins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from xkernels.backend import Backend
    from xkernels.registry import OpImpl, TuningDir

PROJECT = "xkernels"
ENTRY_POINT_GROUP = "xkernels.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def xkernels_add_backends() -> Sequence[Backend]:
    """Return the backends this plugin provides.

    Each is an instance of :class:`xkernels.Backend` with a unique ``name``. Two plugins that
    return the same name is an error raised when the registry loads. Constructing a backend must
    be cheap and must not import vendor stacks (torch_npu, CANN, drivers): do that lazily in
    ``is_available()`` so that ``import xkernels`` never fails on a machine without the device.
    """


@hookspec
def xkernels_add_op_impls() -> Sequence[OpImpl]:
    """Return op implementations that replace the portable kernel on one backend.

    Each :class:`xkernels.OpImpl` names an op (``"add"``, ``"broadcast"``, ``"matmul"``,
    ``"linear"``), a backend name and a callable with the op's public signature. The op's
    arguments are validated before the callable runs, so it receives well-formed input. When
    several plugins override the same (op, backend) the highest ``priority`` wins; a tie is an
    error.
    """


@hookspec
def xkernels_add_tuning_dirs() -> Sequence[TuningDir]:
    """Return extra tuning-table directories for a backend (yours or a built-in one).

    A :class:`xkernels.TuningDir` names a backend and a directory holding ``<op>.json`` tables.
    Directories from plugins are searched before the backend's own ``tuning_dirs``, so a plugin
    can ship tables for a new architecture of an existing backend without changing xkernels.
    """


@hookspec(firstresult=True)
def xkernels_tune_plan(op: Any, call: Any, backend: Backend, plan: Any) -> Any | None:
    """Tune the bucket of one call whose plan comes from no measured rule, and return the plan to
    run instead (``None``: keep ``plan``). Called by ``Op.plan`` while autotune is on
    (``XKERNELS_AUTOTUNE=1`` or ``with xkernels.tuning.autotune():``), at most once per bucket and
    process, never while a config is forced. ``op`` is the :class:`xkernels.ops.Op`, ``call``
    its checked call record. The built-in implementation is :mod:`xkernels.autotune`, registered
    like any plugin; the first non-``None`` answer wins.
    """
