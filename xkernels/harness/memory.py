"""How much memory one accuracy case needs at its peak, and how much the machine has free.

``python -m xkernels.check`` runs a case only when its estimated peak fits the free memory of
the device it runs on and of the host, where inputs are generated and the float64 reference is
computed (on a cpu target both are one pool). A case that does not fit is skipped and reported
with both numbers; it is never left to the out-of-memory killer.

The estimate (:func:`footprint`) follows what :func:`xkernels.harness.accuracy.check_case`
allocates, phase by phase, from the case's shapes and dtypes alone (nothing is allocated):

* inputs (a step-sliced operand keeps its 2x base), ``out=``, and one clone of every input;
* generation: float16/bfloat16 inputs are drawn as float32 on the host, then cast;
* reference: every input widened to float64 (int64 for ints) and the wide result; matmul-like
  ops also ``|A|``, ``|B|`` and ``|A|@|B|`` in float64, and linear's pre-activation result;
  the fused ops (add + norms, rotary_embedding) their magnitudes, kept for the comparison;
* call and comparison: the op's result, kernel scratch (an operand-sized copy for matmul's
  realignment, a result-sized one otherwise), the result copied to the host, the reference cast
  to the result dtype, and float64 temporaries of one comparison chunk;
* plus :data:`OVERHEAD` per pool. On a cpu, measured peaks (resident set growth over one case)
  were within the estimate or up to 50 MiB above the shape-based part, e.g. add float32
  2048x2048: estimate 368 MiB (without overhead), measured 337 MiB; broadcast float32 512^3:
  4480 / 4229 MiB; linear bfloat16 1024^2 + gelu: 88 / 137 MiB.

Free memory (:func:`free_memory`): cpu: ``MemAvailable`` from ``/proc/meminfo`` (else free pages
from ``os.sysconf``), lowered to the cgroup's limit minus its usage where one is set; cuda / npu:
``mem_get_info`` plus what PyTorch's caching allocator holds but does not use. A case may plan
to use :data:`MARGIN` of it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xkernels.harness.case import Case, Inputs, T, expected_result
from xkernels.harness.torch_ops import OPS

#: Fraction of the free memory a case may plan to use: the estimate leaves out allocator
#: rounding, Python objects and other processes' growth while the case runs.
MARGIN = 0.85
#: Bytes per element of the comparison's temporaries per chunk element (two float64 copies,
#: error, allowance, masked selections: ~6 float64 arrays, plus boolean masks).
COMPARE_BYTES_PER_ELEMENT = 56
#: Per pool, for what the shapes do not show (BLAS and allocator workspaces): 1024^2 float32
#: matmul and linear cases on a cpu measured up to 50 MiB above the shape-based estimate.
OVERHEAD = 64 << 20
_CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Footprint:
    """Estimated peak bytes of one case: on the target device (0 for a cpu target) and on the host."""

    device: int
    host: int


@dataclass(frozen=True)
class FreeMemory:
    """Bytes free on the target device (``None`` for a cpu target) and on the host, and where
    the numbers come from."""

    device: int | None
    host: int
    source: str

    def __str__(self) -> str:
        dev = "" if self.device is None else f"device {gib(self.device)}, "
        return f"{dev}host {gib(self.host)} free ({self.source})"


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _wide_size(dtype: torch.dtype) -> int:
    return 16 if dtype.is_complex else 8  # float64 / int64 (complex128)


def _meta_inputs(case: Case) -> Inputs:
    meta = lambda a: torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, T) else a  # noqa: E731
    return Inputs(tuple(meta(a) for a in case.args), {k: meta(v) for k, v in case.kwargs})


def footprint(case: Case, device: torch.device, chunk: int) -> Footprint:
    """The estimated peak of ``check_case(case)`` on ``device`` (see the module doc)."""
    specs = [a for a in (*case.args, *(v for _, v in case.kwargs)) if isinstance(a, T)]  # linear's residual=
    outs = expected_result(case.op, _meta_inputs(case))
    outs = outs if isinstance(outs, tuple) else (outs,)  # (y, s) of the fused norms
    out = outs[0]
    out_numel = sum(o.numel() for o in outs)
    out_bytes = sum(o.numel() * _element_size(o.dtype) for o in outs)
    stored = sum(math.prod(s.shape) * (2 if s.view == "strided" else 1) * _element_size(s.dtype) for s in specs)
    logical = sum(math.prod(s.shape) * _element_size(s.dtype) for s in specs)  # clones are dense
    wide_in = sum(math.prod(s.shape) * _wide_size(s.dtype) for s in specs)
    wide_out = out_numel * _wide_size(out.dtype)
    gen_tmp = max([math.prod(s.shape) * (2 if s.view == "strided" else 1) * 4 for s in specs
                   if s.dtype.is_floating_point and s.dtype != torch.float32] + [0])
    matmul_like = OPS[case.op].matmul_like
    activation = case.op == "linear" and any(isinstance(a, str) for a in case.args)
    gated = case.op == "gated_linear"  # its reference keeps gate, up, their magnitudes and act(gate)

    out_new = out_bytes if case.out == "new" else 0
    result = out_bytes if case.out is None else 0
    scratch = stored if matmul_like else out_bytes
    reference = wide_in + wide_out + (wide_in + wide_out if matmul_like else 0) + (wide_out if activation else 0)
    reference += 6 * wide_out if gated else 0
    if len(outs) > 1:  # the fused norms' reference: the rounded sum, centred values and magnitude as well
        reference += 3 * wide_out
    # the reference and its magnitude (|A|@|B|; the fused ops': |x||cs|, the norms' y) during the comparison:
    # rotary_embedding's Llama-3-8B prefill 1x2048 on a cpu, estimated 822 / measured 840 MiB bf16, 924 / 951 fp32
    kept = wide_out * (2 if matmul_like or OPS[case.op].reference is not None else 1)
    compare = out_bytes + min(out_numel, chunk) * COMPARE_BYTES_PER_ELEMENT  # reference cast + temporaries

    if device.type == "cpu":
        held = stored + out_new + logical
        peak = max(stored + gen_tmp, held + reference, held + kept + result + scratch + compare)
        return Footprint(0, peak + OVERHEAD)
    device_peak = stored + out_new + logical + result + scratch
    host_peak = max(stored + gen_tmp, reference, kept + out_bytes + compare)  # out_bytes: result.cpu()
    return Footprint(device_peak + OVERHEAD, host_peak + OVERHEAD)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_free() -> int | None:
    """The cgroup's memory limit minus its usage (less reclaimable file cache), if a limit is set."""
    for limit_f, usage_f, stat_f in (("memory.max", "memory.current", "memory.stat"),  # cgroup v2
                                     ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                      "memory/memory.stat")):  # cgroup v1
        limit, usage = _read_int(_CGROUP / limit_f), _read_int(_CGROUP / usage_f)
        if limit is None or usage is None or limit >= 1 << 60:  # absent or unlimited
            continue
        cache = 0
        try:
            for line in (_CGROUP / stat_f).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key in ("inactive_file", "total_inactive_file") and value.isdigit():
                    cache = max(cache, int(value))
        except OSError:
            pass
        return max(0, limit - usage + cache)
    return None


def host_free() -> tuple[int, str]:
    """Bytes the host can still allocate without swapping or the OOM killer, and the source."""
    free, source = None, ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free, source = int(line.split()[1]) * 1024, "MemAvailable"
                break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free, source = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages"
        except (ValueError, OSError, AttributeError):
            free, source = 1 << 62, "unknown (no limit applied)"
    cgroup = _cgroup_free()
    if cgroup is not None and cgroup < free:
        free, source = cgroup, "cgroup limit - usage"
    return free, source


def device_free(device: torch.device) -> int | None:
    """Bytes free on an accelerator (driver's free + PyTorch's cached, unused blocks); ``None``
    for the cpu or a device type whose module has no ``mem_get_info``."""
    if device.type == "cpu":
        return None
    module: Any = getattr(torch, device.type, None)
    info = getattr(module, "mem_get_info", None)
    if info is None:
        return None
    free, _total = info(device)
    try:
        free += module.memory_reserved(device) - module.memory_allocated(device)
    except (AttributeError, RuntimeError):
        pass
    return int(free)


def free_memory(device: torch.device) -> FreeMemory:
    host, source = host_free()
    dev = device_free(device)
    if device.type != "cpu":
        source = f"{device.type} mem_get_info; host {source}" if dev is not None else \
            f"{device.type}: free memory unknown, not limited; host {source}"
    return FreeMemory(dev, host, source)


def does_not_fit(need: Footprint, free: FreeMemory, cap: int | None = None) -> str | None:
    """Why a case of footprint ``need`` cannot run with ``free`` memory (``cap``: a user limit on
    the bytes per pool), or ``None`` when it fits."""
    reasons = []
    for pool, want, have in (("device", need.device, free.device), ("host", need.host, free.host)):
        if have is None and cap is None:
            continue
        allowed = min(x for x in (None if have is None else int(have * MARGIN), cap) if x is not None)
        if want > allowed:
            limit = "--max-memory" if cap is not None and allowed == cap else f"{MARGIN:.0%} of {gib(have or 0)} free"
            reasons.append(f"needs ~{gib(want)} on the {pool}, allowed {gib(allowed)} ({limit})")
    return "; ".join(reasons) or None
