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
            extra={"torch_threads": torch.get_num_threads()},
        )


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@hookimpl
def xkernels_add_backends() -> list[Backend]:
    return [CpuBackend()]
