"""Ascend NPU backend: torch_npu for tensors, sync and events; triton-ascend for kernels.

Nothing here imports torch_npu at module import: it links against CANN and raises at import on a
machine without it. ``is_available()`` imports it on first use and reports why it failed.

Launch geometry follows triton-ascend: a grid maps to physical cores (at most 65535 programs).
Element-wise kernels launch one program per vector core and tl.dot kernels one per AI (cube)
core; each program loops over its share of the tiles (a persistent loop). Core counts come from
the driver; the datasheet table below is shown beside them, never used for launching on a device.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

from xkernels.backend import Backend, DeviceProperties, Figure, Unit
from xkernels.hookspecs import hookimpl

MAX_GRID = 65535
UNIFIED_BUFFER_BYTES = 192 * 1024
L0C_BYTES = 128 * 1024

# Public figures for Atlas 800T/900 A2 parts (Ascend 910B family), labelled "datasheet".
# cube = AI cores (matrix unit), vector = AI vector cores. fp16 dense TFLOP/s.
DATASHEET: dict[str, dict[str, Figure]] = {
    "Ascend910B1": {"cube_cores": Figure(24, "cores", "datasheet"), "vector_cores": Figure(48, "cores", "datasheet"),
                    "hbm_bytes": Figure(64 * 2**30, "B", "datasheet"), "fp16_tflops": Figure(378, "TFLOP/s", "datasheet")},
    "Ascend910B2": {"cube_cores": Figure(24, "cores", "datasheet"), "vector_cores": Figure(48, "cores", "datasheet"),
                    "hbm_bytes": Figure(64 * 2**30, "B", "datasheet"), "fp16_tflops": Figure(354, "TFLOP/s", "datasheet")},
    "Ascend910B3": {"cube_cores": Figure(20, "cores", "datasheet"), "vector_cores": Figure(40, "cores", "datasheet"),
                    "hbm_bytes": Figure(64 * 2**30, "B", "datasheet"), "fp16_tflops": Figure(295, "TFLOP/s", "datasheet")},
    "Ascend910B4": {"cube_cores": Figure(20, "cores", "datasheet"), "vector_cores": Figure(40, "cores", "datasheet"),
                    "hbm_bytes": Figure(32 * 2**30, "B", "datasheet"), "fp16_tflops": Figure(246, "TFLOP/s", "datasheet")},
}


def soc_family(soc: str) -> str:
    """``"Ascend910B3"`` → ``"Ascend910B"``: the fallback key of the npu tuning tables."""
    m = re.match(r"(Ascend\d+[A-Z]?)", soc)
    return m.group(1) if m else soc


def grid_for(n_tiles: int, cores: int) -> int:
    """Programs for ``n_tiles`` on ``cores`` physical cores: never more than either, nor 65535."""
    return max(1, min(n_tiles, cores, MAX_GRID))


def _import_torch_npu() -> Any:
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import torch_npu  # noqa: F401  (registers torch.npu)

    return torch_npu


class NpuBackend(Backend):
    name = "npu"
    device_type = "npu"
    runs_triton = True
    alignment = 32  # vector unit: 32-byte blocks of the unified buffer
    cube_alignment = 512  # cube unit operands
    launch_options = ()  # num_warps/num_stages mean nothing to triton-ascend
    priority = 10

    @functools.cache  # noqa: B019 - one backend object per process
    def unavailable_reason(self) -> str | None:
        try:
            _import_torch_npu()
        except (ImportError, OSError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"torch_npu could not be imported ({type(exc).__name__}: {first}); it needs CANN and an Ascend driver"
        import torch

        if not torch.npu.is_available():
            return "torch_npu is installed but sees no NPU (torch.npu.is_available() is False)"
        try:
            import triton
            from triton.runtime import driver

            target = driver.active.get_current_target()
        except Exception as exc:
            return f"triton-ascend is not usable ({exc}); install it: pip install triton-ascend"
        if target.backend != "npu":
            return f"Triton {triton.__version__}'s active driver targets {target.backend!r}; install triton-ascend"
        return None

    def synchronize(self, device: Any = None) -> None:
        import torch

        torch.npu.synchronize(device)

    def Event(self, enable_timing: bool = True) -> Any:  # noqa: N802
        import torch

        return torch.npu.Event(enable_timing=enable_timing)

    @functools.cache  # noqa: B019
    def _cores(self, index: int) -> tuple[int, int]:
        """(cube cores, vector cores) read from the driver, never from a table."""
        import torch

        try:
            from triton.runtime import driver

            props = driver.active.utils.get_device_properties(index)
            return int(props["num_aicore"]), int(props["num_vectorcore"])
        except Exception:
            p = torch.npu.get_device_properties(index)
            return int(p.cube_core_num), int(p.vector_core_num)

    def _index(self, device: Any) -> int:
        import torch

        if device is None:
            return torch.npu.current_device()
        if isinstance(device, int):
            return device
        dev = torch.device(device)
        return dev.index if dev.index is not None else torch.npu.current_device()

    def max_programs(self, unit: Unit = "vector", device: Any = None) -> int:
        cube, vector = self._cores(self._index(device))
        return min(cube if unit == "cube" else vector, MAX_GRID)

    def properties(self, device: Any = None) -> DeviceProperties:
        self.require_available()
        import torch

        from xkernels import peaks

        index = self._index(device)
        name = torch.npu.get_device_name(index)
        cube, vector = self._cores(index)
        free, total = torch.npu.mem_get_info(index)
        return DeviceProperties(
            backend=self.name,
            name=name,
            arch=name,
            compute_units=cube,
            compute_unit_kind="AI core",
            vector_units=vector,
            memory_bytes=total,
            max_programs_per_launch=MAX_GRID,
            copy_bandwidth=peaks.cached_figure(self.name, name, "copy_bandwidth"),
            matmul_peak=peaks.cached_figure(self.name, name, "matmul_peak"),
            datasheet=dict(DATASHEET.get(name, {})),
            extra={"unified_buffer_bytes": UNIFIED_BUFFER_BYTES, "l0c_bytes": L0C_BYTES},
        )

    def arch(self, device: Any = None) -> str:
        import torch

        return torch.npu.get_device_name(self._index(device))

    def arch_fallbacks(self, arch: str) -> list[str]:
        return [arch, soc_family(arch)] if soc_family(arch) != arch else [arch]


@hookimpl
def xkernels_add_backends() -> list[Backend]:
    return [NpuBackend()]
