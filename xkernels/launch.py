"""Kernel launches: the one place where ops hand a prepared plan to Triton.

``Launcher`` launches one ``@triton.jit`` kernel for one plan (fixed grid, constexprs and
options). The first launch of each specialization goes through ``kernel[grid](...)``, which
compiles and returns the ``CompiledKernel``; later launches call ``CompiledKernel.run`` directly,
which skips Triton's per-call argument binding and cache-key hashing (~20 µs → ~5-9 µs on an H100).

The direct path is used only where its calling convention was checked (``FAST_TRITON``, Triton
3.6: ``run(gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook,
exit_hook, *all_args)`` with constexprs included in ``all_args``). Any other Triton, the
interpreter, a backend that opts out (``Backend.fast_launch``), or any error while setting it up
falls back to ``kernel[grid](...)`` for that launcher, for good.

The specialization key covers what Triton specializes on among the values that can change
between calls of one plan: each tensor's 16-byte alignment, each int scalar's value class
(== 1, divisible by 16, needs 64 bits). Everything else is fixed by the plan.

``Launcher.hot`` goes one step further for an op's repeated calls (see ``Op.__call__``): a
launch function of the data pointers alone. Where it can, that is a ``cuda_launch.Record``
(everything but the pointers packed once; one C call per launch into ``cuLaunchKernel``);
otherwise a closure calling the compiled kernel's own C launch function with integer pointers.
Either skips, per call, Triton's Python launcher wrapper, the launch-metadata dict, a Python call
of the (empty) launch hook chains, and the driver's pointer-attribute query per tensor. They
apply only while no launch hook is installed (e.g. by a profiler), for 16-byte-aligned pointers,
and for kernels without scratch memory; otherwise they report that they did not launch and the
caller takes the ordinary path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from xkernels.backends import cuda_launch

FAST_TRITON = ("3.6.",)


def _triton_fast_ok() -> bool:
    if os.environ.get("XKERNELS_FAST_LAUNCH", "1") == "0":  # opt out, e.g. to compare
        return False
    try:
        import triton
    except ImportError:
        return False
    return triton.__version__.startswith(FAST_TRITON)


_FAST_OK: bool | None = None


def _spec(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.data_ptr() % 16 == 0
    if isinstance(v, bool):
        return "b"
    if isinstance(v, int):
        return (v == 1, v % 16 == 0, -(2**31) <= v < 2**31)
    return None


class Launcher:
    """Launches ``kernel`` on ``grid`` with fixed ``constexprs``/``options``; see the module doc.

    ``varying`` lists the positions of runtime arguments that can change between calls of the
    plan (tensors, scalars passed by value); the others are fixed by the plan.
    """

    def __init__(self, kernel: Any, grid: tuple[int, ...], constexprs: dict[str, Any],
                 options: dict[str, Any], fast: bool, varying: tuple[int, ...] | None = None) -> None:
        global _FAST_OK
        if _FAST_OK is None:
            _FAST_OK = _triton_fast_ok()
        self.kernel = kernel
        self.grid = grid
        self.constexprs = constexprs
        self.options = options
        self.fast = fast and _FAST_OK
        self.varying = varying
        self._compiled: dict[Any, tuple[Any, ...]] = {}
        self._tail: tuple[Any, ...] | None = None
        self._g = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)

    def _setup(self, compiled: Any, n_args: int) -> tuple[Any, ...]:
        from triton import knobs
        from triton.runtime import driver

        names = list(self.kernel.arg_names)
        if set(names[n_args:]) != set(self.constexprs):
            raise TypeError("constexprs are not the trailing kernel parameters")
        self._tail = tuple(self.constexprs[n] for n in names[n_args:])
        active = driver.active
        self._stream = active.get_current_stream
        self._device = active.get_current_device
        if self._device is torch.cuda.current_device:  # skip its lazy-init check: CUDA is up by now
            self._device = torch._C._cuda_getDevice
        self._knobs = knobs.runtime
        return (compiled.run, compiled.function, compiled.packed_metadata, compiled)

    def __call__(self, *args: Any) -> None:
        if not self.fast:
            self.kernel[self.grid](*args, **self.constexprs, **self.options)
            return
        pos = self.varying if self.varying is not None else range(len(args))
        key = tuple(_spec(args[i]) for i in pos)
        entry = self._compiled.get(key)
        if entry is None:
            compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
            try:
                self._compiled[key] = self._setup(compiled, len(args))
            except Exception:
                self.fast = False  # another launcher API: keep using kernel[grid]
            return
        run, function, packed, compiled = entry
        full = (*args, *self._tail)
        stream = self._stream(self._device())
        k = self._knobs
        enter, leave = k.launch_enter_hook, k.launch_exit_hook
        if getattr(enter, "calls", True) or getattr(leave, "calls", True):  # hooks installed
            meta = compiled.launch_metadata(self.grid, stream, *full)
        else:  # Triton 3.6 always passes its (empty) hook chains; an empty chain needs no metadata
            enter = leave = meta = None
        run(*self._g, stream, function, packed, meta, enter, leave, *full)

    def _compiled_for(self, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any, Any] | None:
        """(the compiled entry of ``args``'s specs, Triton's launch hook chains), or ``None`` off the
        fast path, before the first launch of those specs, or where the hook chains are not the
        ones this Triton's launcher passes (``hot_run``, ``descriptor_record``)."""
        if not self.fast or self._tail is None:
            return None
        pos = self.varying if self.varying is not None else range(len(args))
        entry = self._compiled.get(tuple(_spec(args[i]) for i in pos))
        enter, leave = self._knobs.launch_enter_hook, self._knobs.launch_exit_hook
        if entry is None or not hasattr(enter, "calls") or not hasattr(leave, "calls"):
            return None
        return entry, enter, leave

    def hot_run(self, args: tuple[Any, ...]) -> Callable[..., bool] | None:
        """Triton's compiled launch for calls whose every argument has the spec (``_spec``) of
        ``args``'s: a function of the runtime arguments that returns whether it launched (not
        while a launch hook is installed). ``None`` before the first launch of that spec, or off
        the fast path. For kernels whose arguments ``Launcher.hot`` does not cover (tensor
        descriptors); the caller keeps the specs equal (alignment, int classes)."""
        found = self._compiled_for(args)
        if found is None:
            return None
        (run, function, packed, _), enter, leave = found
        gx, gy, gz = self._g
        stream, device, tail = self._stream, self._device, self._tail

        def go(*call_args: Any) -> bool:
            if enter.calls or leave.calls:
                return False
            run(gx, gy, gz, stream(device()), function, packed, None, None, None, *call_args, *tail)
            return True

        return go

    def descriptor_record(self, args: tuple[Any, ...], ptrs: tuple[int, ...],
                          descriptors: dict[int, cuda_launch.Descriptor]) -> Callable[..., bool] | None:
        """A ``cuda_launch.Record`` of the compiled variant ``hot_run(args)`` launches, for a
        kernel with tensor-descriptor arguments: it takes the tensors at positions ``ptrs`` (at a
        position in ``descriptors``, the descriptor's base tensor; its tensor map is encoded per
        call) and returns whether it launched; every other argument is fixed to ``args``'s.
        ``None`` where no record applies (then ``hot_run``)."""
        found = self._compiled_for(args)
        if found is None:
            return None
        (_, _, _, compiled), enter, leave = found
        if getattr(getattr(compiled.metadata, "target", None), "backend", None) != "cuda":
            return None
        return cuda_launch.record(compiled, self._g, (*args, *self._tail), ptrs, self._device, self._stream,
                                    enter, leave, descriptors)

    def hot(self, args: tuple[Any, ...], ptrs: int | tuple[int, ...]) -> Callable[..., bool]:
        """A launch function for calls that differ from ``args`` only in the tensors at positions
        ``ptrs`` (the first ``ptrs`` arguments when an int; ascending positions otherwise, e.g.
        ``(0, 2)`` when argument 1 is a scalar passed by value). It takes those tensors and returns
        whether it launched; ``False`` means nothing ran and the caller must launch the ordinary
        way (``self(*args)``). Every other argument is fixed: scalar values included."""
        pos = tuple(range(ptrs)) if isinstance(ptrs, int) else tuple(ptrs)
        direct = self._direct(args, pos)
        if direct is not None:
            return direct
        if pos == tuple(range(len(pos))):
            fixed = args[len(pos):]

            def ordinary(*tensors: Any) -> bool:
                self(*tensors, *fixed)
                return True

            return ordinary
        template = list(args)

        def placed(*tensors: Any) -> bool:
            full = template.copy()
            for p, t in zip(pos, tensors):
                full[p] = t
            self(*full)
            return True

        return placed

    def _direct(self, args: tuple[Any, ...], pos: tuple[int, ...]) -> Callable[..., bool] | None:
        """The C launch of ``hot``: a ``cuda_launch.Record`` where one can be made (2 to 8
        tensors, the record's limit), else (for 3 or 4 leading tensors) a closure over Triton's C
        launch function; ``None`` where neither applies (see module doc)."""
        if not self.fast or self._tail is None or not 2 <= len(pos) <= 8:
            return None
        varying = self.varying if self.varying is not None else range(len(args))
        key = tuple(True if i in pos else _spec(args[i]) for i in varying)  # the all-aligned variant
        entry = self._compiled.get(key)
        if entry is None:
            return None
        run, function, packed, compiled = entry
        launch = getattr(run, "launch", None)
        enter, leave = self._knobs.launch_enter_hook, self._knobs.launch_exit_hook
        if (getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
                or not callable(launch) or not hasattr(enter, "calls") or not hasattr(leave, "calls")):
            return None
        if getattr(getattr(compiled.metadata, "target", None), "backend", None) == "cuda":
            rec = cuda_launch.record(compiled, self._g, (*args, *self._tail), pos, self._device,
                                       self._stream, enter, leave)
            if rec is not None:
                return rec
        if pos != tuple(range(len(pos))) or not 3 <= len(pos) <= 4:
            return None
        n_ptrs = len(pos)
        coop, pdl = bool(run.launch_cooperative_grid), bool(run.launch_pdl)
        gx, gy, gz = self._g
        stream, device = self._stream, self._device
        fixed = (*args[n_ptrs:], *self._tail)
        if n_ptrs == 3:
            def go3(t0: Any, t1: Any, t2: Any) -> bool:
                p0, p1, p2 = t0.data_ptr(), t1.data_ptr(), t2.data_ptr()
                if (p0 | p1 | p2) & 15 or enter.calls or leave.calls:
                    return False
                launch(gx, gy, gz, stream(device()), function, coop, pdl, None, None, packed,
                       None, None, None, p0, p1, p2, *fixed)
                return True
            return go3

        def go4(t0: Any, t1: Any, t2: Any, t3: Any) -> bool:
            p0, p1, p2, p3 = t0.data_ptr(), t1.data_ptr(), t2.data_ptr(), t3.data_ptr()
            if (p0 | p1 | p2 | p3) & 15 or enter.calls or leave.calls:
                return False
            launch(gx, gy, gz, stream(device()), function, coop, pdl, None, None, packed,
                   None, None, None, p0, p1, p2, p3, *fixed)
            return True
        return go4


class ByValue:
    """Launch functions of one plan, one per value of the call's by-value scalars (a Python
    number operand, ``alpha``, ``negative_slope``): ``Launcher.hot`` packs every scalar into its
    launch record, so each value gets its own, made by ``make(*values)`` on first use (at most
    ``LIMIT`` at a time). Zeros are keyed with their sign (``-0.0 == 0.0`` as dict keys)."""

    LIMIT = 16

    def __init__(self, make: Callable[..., Callable[..., bool]]) -> None:
        self.make = make
        self.fns: dict[Any, Callable[..., bool]] = {}

    def __call__(self, *values: Any) -> Callable[..., bool]:
        fn = self.fns.get(values) if 0 not in values else None  # a zero's sign needs the slow key
        if fn is not None:
            return fn
        key = tuple(v if v != 0 else (v, repr(v)) for v in values)
        fn = self.fns.get(key)
        if fn is None:
            if len(self.fns) >= self.LIMIT:
                self.fns.clear()
            fn = self.fns[key] = self.make(*values)
        return fn
