"""Interpreter backends: the ops' own Triton kernel sources run on CPU tensors by Triton's
interpreter, inside a normal process (TRITON_INTERPRET need not be set before import).

* ``interpreter``: every tile gets its own program, as on CUDA; its own small tuning tables.
* ``interpreter-npu``: the npu backend's geometry and tables: the grid is capped at an Ascend
  SoC's core counts (``XKERNELS_NPU_SOC``, default Ascend910B3, from the datasheet table) and
  every kernel runs its persistent loop, with the npu tuning entries.

How: the module that defines a kernel is executed a second time with Triton's interpret switch
on, so that the kernel and every ``@triton.jit`` helper it calls become interpreted functions.
Kernels must therefore call only their own module's helpers and ``tl`` builtins (write
``(a + b - 1) // b``, not ``tl.cdiv``).

Rounding: Triton's interpreter casts fp32 to bf16 by truncation; the backends make that cast
round to nearest even, as a GPU's does (``_nearest_bf16_casts``), so bf16 results compare with
PyTorch's as they would on the device.

Threads: Triton's interpreter patches ``triton.language``'s module globals while a kernel runs
and restores them after, so two kernels interpreted at once break each other ("Did you forget to
add @triton.jit?"). Every interpreted launch therefore holds one process-wide lock
(:data:`LAUNCH_LOCK`): calls from many threads work, one kernel at a time.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import Any

from xkernels.backend import Backend, DeviceProperties, Unit
from xkernels.backends.cuda import CudaBackend
from xkernels.hookspecs import hookimpl

from . import npu

_lock = threading.RLock()  # re-entrant: a copied module may itself ask for a copy (a test of a helper)
_modules: dict[str, ModuleType] = {}
#: Held by every interpreted kernel launch (see the module doc).
LAUNCH_LOCK = threading.RLock()


class Serialized:
    """An interpreted kernel whose launches (``kernel[grid](...)``) hold :data:`LAUNCH_LOCK`;
    every other attribute is the kernel's own."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]

        def locked(*args: Any, **kwargs: Any) -> Any:
            with LAUNCH_LOCK:
                return launch(*args, **kwargs)

        return locked

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)


def _nearest_bf16_casts() -> None:
    """Make the interpreter's fp32 -> bf16 casts round to nearest even, as every GPU's do.

    Triton's interpreter (3.6 and before) casts fp32 to bf16 by dropping the low 16 bits, rounding
    toward zero, where a GPU's ``.to(tl.bfloat16)`` rounds to nearest even. Every bf16 result a
    kernel stores then errs about twice as much as on the device, and tests comparing a model
    against PyTorch's bf16 run measured the interpreter, not the kernel. The builder's cast is
    wrapped once, for that one pair of types; an interpreter without it is left as it is."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except ImportError:
        return
    builder = getattr(ti, "InterpreterBuilder", None)
    original = getattr(builder, "cast_impl", None)
    if original is None or getattr(original, "nearest_bf16", False):
        return

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = np.asarray(src.data, dtype=np.float32)
            bits = data.view(np.uint32).astype(np.uint64)
            out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            nan = np.isnan(data)
            if nan.any():  # a quiet NaN of the same sign
                out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
            return ti.TensorHandle(out, dst_type.scalar)
        return original(self, src, dst_type)

    cast_impl.nearest_bf16 = True  # type: ignore[attr-defined]
    builder.cast_impl = cast_impl
    # the builder's fp_trunc (and the other casts) are lambdas over ``self.cast_impl``: they see it


def _interpreted_module(modname: str) -> ModuleType:
    """A copy of module ``modname`` whose ``@triton.jit`` functions are interpreted."""
    with _lock:
        mod = _modules.get(modname)
        if mod is not None:
            return mod
        import triton

        _nearest_bf16_casts()

        spec = importlib.util.find_spec(modname)
        if spec is None or spec.origin is None:
            raise ImportError(f"cannot find the source of kernel module {modname!r}")
        knobs = getattr(triton, "knobs", None)  # Triton >= 3.4; older ones read the env var
        old_env = os.environ.get("TRITON_INTERPRET")
        old_knob = knobs.runtime.interpret if knobs is not None else None
        os.environ["TRITON_INTERPRET"] = "1"
        if knobs is not None:
            knobs.runtime.interpret = True
        try:
            copy_spec = importlib.util.spec_from_file_location(f"{modname}__interpreted", spec.origin)
            assert copy_spec is not None and copy_spec.loader is not None
            mod = importlib.util.module_from_spec(copy_spec)
            sys.modules[copy_spec.name] = mod
            copy_spec.loader.exec_module(mod)
        finally:
            if old_env is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = old_env
            if knobs is not None:
                knobs.runtime.interpret = old_knob
        _modules[modname] = mod
        return mod


def _probe(triton_version: str) -> str | None:
    """Run a tiny kernel with a loop bounded by a runtime argument, as the ops' kernels have.

    Triton 3.6's interpreter turns 1-element arrays into Python ints, which numpy >= 2.4
    refuses; such a pair cannot run the ops, and saying so beats failing inside a kernel.
    """
    import torch

    from xkernels.backends import interpreter_probe as probe_kernels

    try:
        out = torch.zeros(4, dtype=torch.int32)
        Serialized(_interpreted_module(probe_kernels.__name__).loop_probe)[(1,)](out, 4)
        if out.tolist() != [0, 1, 2, 3]:
            return f"Triton {triton_version}'s interpreter computed a wrong result in a self-test"
    except Exception as exc:  # noqa: BLE001 - any failure means the ops cannot run here
        import numpy

        return (f"Triton {triton_version}'s interpreter cannot run a runtime-bounded loop with numpy "
                f"{numpy.__version__} ({type(exc).__name__}); use numpy<2.4 or a newer Triton")
    return None


class InterpreterBackend(Backend):
    name = "interpreter"
    device_type = "cpu"
    runs_triton = True
    alignment = 16  # checks the same rules as cuda
    default_for_device = False  # cpu tensors go to "cpu" unless this is asked for
    launch_options = ()  # the interpreter takes no num_warps/num_stages
    native_bf16_dot = False  # its tl.dot multiplies bfloat16's raw uint16 storage
    priority = -10
    route_host_ms = CudaBackend.route_host_ms  # the selection of the cuda backend it emulates
    stream_floor = CudaBackend.stream_floor

    @functools.cache  # noqa: B019
    def unavailable_reason(self) -> str | None:
        try:
            import triton
            from triton.runtime.interpreter import InterpretedFunction  # noqa: F401
        except ImportError as exc:
            return f"Triton is not importable ({exc}); install it: pip install 'xkernels[triton]'"
        return _probe(triton.__version__)

    def kernel(self, jit_fn: Any) -> Any:
        """The interpreted twin of ``jit_fn`` (same source, same module), launched under
        :data:`LAUNCH_LOCK`."""
        mod = _interpreted_module(jit_fn.fn.__module__)
        return Serialized(getattr(mod, jit_fn.fn.__name__))

    def properties(self, device: Any = None) -> DeviceProperties:
        import platform

        return DeviceProperties(
            backend=self.name,
            name=f"Triton interpreter on {platform.machine()}",
            arch=self.arch(),
            compute_units=os.cpu_count(),
            compute_unit_kind="CPU core",
            memory_bytes=None,
            max_programs_per_launch=self.max_programs(),
        )

    def arch(self, device: Any = None) -> str:
        return "interpreter"


class InterpreterNpuBackend(InterpreterBackend):
    name = "interpreter-npu"
    tuning_name = "npu"
    alignment = npu.NpuBackend.alignment
    cube_alignment = npu.NpuBackend.cube_alignment

    @property
    def soc(self) -> str:
        return os.environ.get("XKERNELS_NPU_SOC", "Ascend910B3")

    def _cores(self) -> tuple[int, int]:
        sheet = npu.DATASHEET.get(self.soc)
        if sheet is None:
            raise ValueError(f"XKERNELS_NPU_SOC={self.soc!r} has no datasheet entry; "
                             f"known: {', '.join(npu.DATASHEET)}")
        return int(sheet["cube_cores"].value), int(sheet["vector_cores"].value)

    def max_programs(self, unit: Unit = "vector", device: Any = None) -> int:
        cube, vector = self._cores()
        return min(cube if unit == "cube" else vector, npu.MAX_GRID)

    def arch(self, device: Any = None) -> str:
        return self.soc

    def arch_fallbacks(self, arch: str) -> list[str]:
        return npu.NpuBackend().arch_fallbacks(arch)

    def properties(self, device: Any = None) -> DeviceProperties:
        cube, vector = self._cores()
        return DeviceProperties(
            backend=self.name,
            name=f"Triton interpreter emulating {self.soc}'s launch geometry",
            arch=self.soc,
            compute_units=cube,
            compute_unit_kind="AI core (emulated)",
            vector_units=vector,
            memory_bytes=None,
            max_programs_per_launch=npu.MAX_GRID,
            datasheet=dict(npu.DATASHEET.get(self.soc, {})),
        )


@hookimpl
def xkernels_add_backends() -> list[Backend]:
    return [InterpreterBackend(), InterpreterNpuBackend()]
