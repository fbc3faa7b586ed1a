"""Ascend NPU backend: torch_npu for tensors, sync and events; triton-ascend for kernels.

Nothing here imports torch_npu at module import: it links against CANN and raises at import on a
machine without it. ``is_available()`` imports it on first use and reports why it failed.

Launch geometry follows triton-ascend: a grid maps to physical cores (at most 65535 programs).
Element-wise kernels launch one program per vector core and tl.dot kernels one per AI (cube)
core; each program loops over its share of the tiles (a persistent loop). Core counts come from
the driver; the SoC table (npu_socs.json) is shown beside them, never used for launching on a device.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

from xkernels.backend import Backend, DeviceProperties, Figure, Unit
from xkernels.hookspecs import hookimpl

MAX_GRID = 65535
#: On-chip memory of the Atlas A2/A3 SoCs; used for an SoC npu_socs.json does not list. (The A5
#: parts, Ascend 950, have 248 KiB of UB and 256 KiB of L0C: their own entries in the file.)
UNIFIED_BUFFER_BYTES = 192 * 1024
L0C_BYTES = 128 * 1024

#: npu_socs.json: per SoC its family (the tuning-table keys it falls back to), core counts and
#: on-chip memory sizes from the compiler's target description, and datasheet figures where
#: public ones are known; "sources" says where each field comes from.
SOC_TABLE: dict[str, Any] = json.loads(Path(__file__).with_name("npu_socs.json").read_text())
SOCS: dict[str, dict[str, Any]] = SOC_TABLE["socs"]

_COMPILER_NOTE = "bishengir-compile 1.2.0 target description"
_FIGURES = {  # field -> (unit, note)
    "cube_cores": ("cores", _COMPILER_NOTE), "vector_cores": ("cores", _COMPILER_NOTE),
    "ub_bytes": ("B", _COMPILER_NOTE), "l0c_bytes": ("B", _COMPILER_NOTE), "l1_bytes": ("B", _COMPILER_NOTE),
    "l0a_bytes": ("B", _COMPILER_NOTE), "l0b_bytes": ("B", _COMPILER_NOTE),
    "hbm_bytes": ("B", ""), "fp16_tflops": ("TFLOP/s", ""),
}

# Figures by SoC, labelled "datasheet" (the note names the compiler where it is the source).
# cube = AI cores (matrix unit), vector = AI vector cores. fp16 dense TFLOP/s.
DATASHEET: dict[str, dict[str, Figure]] = {
    soc: {k: Figure(v, _FIGURES[k][0], "datasheet", _FIGURES[k][1]) for k, v in fields.items() if k in _FIGURES}
    for soc, fields in SOCS.items()
}


def soc_family(soc: str) -> str:
    """``"Ascend910B3"`` → ``"Ascend910B"``, ``"Ascend910_9392"`` → ``"Ascend910_93"``: the SoC's
    family in npu_socs.json, else one read from the name."""
    if soc in SOCS:
        return str(SOCS[soc]["family"])
    if re.match(r"Ascend910_95|Ascend950", soc):
        return "Ascend950"
    m = re.match(r"(Ascend910_93)\d", soc) or re.match(r"(Ascend\d+[A-Z]?)", soc)
    return m.group(1) if m else soc


def soc_toolchain(soc: str) -> str:
    """``"a5"`` for an Ascend 950 part (triton-ascend's compile_on_910_95 path and
    bishengir-compile-a5), else ``"a2a3"``: the family's ``toolchain`` in npu_socs.json."""
    return str(SOC_TABLE["families"].get(soc_family(soc), {}).get("toolchain", "a2a3"))


#: The compiler target-description fields of npu_socs.json other than the core counts.
PLAN_FIELDS = ("arch", "ub_bytes", "l0a_bytes", "l0b_bytes", "l0c_bytes", "l1_bytes", "ub_align_bytes",
               "l1_align_bytes", "l0c_align_bytes", "dcache_min_bytes", "dcache_max_bytes")


def memory_class(soc: str) -> tuple[Any, ...]:
    """What of ``soc``'s target description a memory plan can depend on: its toolchain and every
    size and alignment (not the core counts). SoCs of one class get the same plan for the same
    kernel input (docs/npu-offline-compile.md says how that was checked); an SoC the file does
    not list is a class of its own."""
    sheet = SOCS.get(soc)
    if sheet is None:
        return ("unlisted", soc)
    return (soc_toolchain(soc), *(sheet.get(k) for k in PLAN_FIELDS))


def table_keys(soc: str) -> list[str]:
    """The npu tuning-table keys ``soc`` reads, most specific first: the SoC, its family, and the
    families it falls back to (A3 → the A2 family's rules; A5 reads only its own; see npu_socs.json)."""
    family = soc_family(soc)
    fallback = SOC_TABLE["families"].get(family, {}).get("table_keys", [family])
    return list(dict.fromkeys([soc, family, *fallback]))


def memory_bytes(soc: str) -> dict[str, int]:
    """``{"unified_buffer_bytes", "l0c_bytes"}`` of ``soc`` (the A2/A3 sizes for an unlisted SoC)."""
    sheet = SOCS.get(soc, {})
    return {"unified_buffer_bytes": int(sheet.get("ub_bytes", UNIFIED_BUFFER_BYTES)),
            "l0c_bytes": int(sheet.get("l0c_bytes", L0C_BYTES))}


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
            extra=memory_bytes(name),
        )

    def arch(self, device: Any = None) -> str:
        import torch

        return torch.npu.get_device_name(self._index(device))

    def arch_fallbacks(self, arch: str) -> list[str]:
        return table_keys(arch)


@hookimpl
def xkernels_add_backends() -> list[Backend]:
    return [NpuBackend()]
