"""Training calls of an ``add_layer_norm`` / ``add_rms_norm`` route recorded by a native grad_fn.

A route's repeated training call (``add_norm_route``: ``autograd_run``) normally goes through
``AddNormFunction``, a Python ``autograd.Function``. Where the native extension is loaded
(``backends/native.py``) and the route's forward launch is a packed record (CUDA) or a CPU
backend's Python launch (the interpreters, so CI runs the node), the call goes to an
``AddNormSpec`` (``backends/native.cpp``) instead: one per route and ``(eps, offset)`` value,
made at that value's second training call (its first one made the record). The spec allocates
the results, launches the forward and makes the grad_fn in C++; the grad_fn launches the
backward the signature's first Python backward planned (``add_norm_bwd.HotBackward``,
installed through ``native_backward``) and reduces d(w)/d(b) with ATen, without the GIL.
Everything else goes back to Python (``saved_grads``, the op's own backward).

Results are the same tensors either way: same kernels, same launch arguments, same reduction.
While a Triton launch hook is installed (a profiler) the forward takes the Python route; a
backward already recorded natively launches without the hook (``torch.profiler`` still sees the
kernel).
"""

from __future__ import annotations

from typing import Any

import torch

from xkernels.backends import native
from xkernels.ops.fused import add_norm_bwd
from xkernels.ops.fused import add_norm_grad as grad

LIMIT = 16  # specs kept per route, by (eps, offset) value
POISON = False  # tests: specs made while it is set NaN-fill their results and gradients before each launch


def _fallback(spec: Any, meta: tuple[Any, ...], dy: Any, ds: Any, s: torch.Tensor, mean: Any, rstd: torch.Tensor,
              weight: Any, needs: tuple[bool, ...]) -> tuple[Any, ...]:
    """The native grad_fn's Python backward: the op's own; then, where the signature's first
    backward just planned a repeat the spec can launch, it is handed to the spec."""
    out = grad.saved_grads(meta, dy, ds, s, mean, rstd, weight, needs)
    hot = meta[-1]
    if dy is not None and not spec.has_backward:
        found = hot.native_backward(meta[2], dy, ds, tuple(needs))
        if found is not None:
            spec.set_backward(*found)
    return out


class NativeSide:
    """The native specs of one route's training side (see the module doc)."""

    __slots__ = ("side", "backend", "size", "dtype", "layer", "meta", "specs", "hooks")

    def __init__(self, side: Any, backend: Any, size: tuple[int, ...], dtype: torch.dtype, layer: bool,
                 meta: tuple[Any, ...]) -> None:
        self.side, self.backend, self.size, self.dtype, self.layer = side, backend, size, dtype, layer
        self.meta = meta  # AddNormFunction's meta without (kind, eps, offset): shape, dtypes, backend, HotBackward
        self.specs: dict[tuple[Any, Any], Any] = {}
        self.hooks = None

    def spec(self, eps: Any, offset: Any) -> Any:
        """The spec of this value, or ``None`` (the Python route takes the call)."""
        got = self.specs.get((eps, offset))
        if got is not None:
            return got if got is not False and not self._hooked() else None
        mod = native.ready()
        if mod is None:
            native.module()  # starts the build where none was requested yet
            return None
        record = self.side.fns.get((eps, offset))
        if record is None:
            return None  # this value's first call makes the record
        how = add_norm_bwd.native_launch(record, self.backend)
        if len(self.specs) >= LIMIT:
            self.specs.clear()
        if how is None:
            self.specs[(eps, offset)] = False
            return None
        kind = "layer" if self.layer else "rms"
        meta = (kind, eps, offset, *self.meta)
        spec = mod.AddNormSpec(how, list(self.size), self.dtype, self.layer,
                               lambda sp, *a: _fallback(sp, meta, *a))
        spec.poison = POISON
        self.specs[(eps, offset)] = spec
        return None if self._hooked() else spec

    def _hooked(self) -> bool:
        """Whether a Triton launch hook is installed (Triton's launcher would call it)."""
        knobs = self.hooks
        if knobs is None:
            knobs = self.hooks = getattr(self.side.launcher, "_knobs", False)
        return bool(knobs) and bool(getattr(knobs.launch_enter_hook, "calls", False)
                                    or getattr(knobs.launch_exit_hook, "calls", False))
