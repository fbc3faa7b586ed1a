"""CPU backend: the fallback. Ops run through PyTorch on CPU tensors; timing uses perf_counter."""

from __future__ import annotations

import os
from typing import Any

import torch

from xkernels.backend import Backend, DeviceProperties
from xkernels.hookspecs import hookimpl


class CpuBackend(Backend):
    name = "cpu"
    device_type = "cpu"
    runs_triton = False
    alignment = 64  # a cache line; full-width AVX-512 loads
    priority = 0

    def properties(self, device: Any = None) -> DeviceProperties:
        import platform

        from xkernels import peaks

        name = platform.processor() or platform.machine() or "cpu"
        return DeviceProperties(
            backend=self.name,
            name=name,
            arch=platform.machine() or "cpu",
            compute_units=os.cpu_count(),
            compute_unit_kind="CPU core",
            memory_bytes=_total_memory(),
            max_programs_per_launch=1,
            copy_bandwidth=peaks.cached_figure(self.name, name, "copy_bandwidth"),
            matmul_peak=peaks.cached_figure(self.name, name, "matmul_peak"),
            extra={"torch_threads": torch.get_num_threads(), "llc_bytes": _last_level_cache()},
        )


def _last_level_cache() -> int | None:
    """Bytes of CPU 0's highest-level cache (Linux sysfs), ``None`` where it is not reported."""
    best: tuple[int, int] | None = None
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(root):
            if not entry.startswith("index"):
                continue
            with open(f"{root}/{entry}/level") as f:
                level = int(f.read())
            with open(f"{root}/{entry}/size") as f:
                size = f.read().strip()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
            nbytes = int(size.rstrip("KMGkmg")) * unit
            if best is None or (level, nbytes) > best:
                best = (level, nbytes)
    except (OSError, ValueError):
        return None
    return best[1] if best else None


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@hookimpl
def xkernels_add_backends() -> list[Backend]:
    return [CpuBackend()]
