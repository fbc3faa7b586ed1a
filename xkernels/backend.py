"""The backend contract: what every device backend gives the ops and the harnesses.

A backend answers five questions about a device:

* identity: ``name``, the torch ``device_type`` it serves, ``is_available()`` and why not;
* synchronisation and timing: ``synchronize()``, ``Event(enable_timing=True)`` with
  ``record()`` and ``elapsed_time(end)`` in milliseconds, as ``torch.cuda.Event`` works;
* memory alignment: ``alignment`` in bytes, ``is_aligned(tensor)``, ``tile_multiple(dtype)``;
* device properties: :class:`DeviceProperties` (figures marked measured or datasheet);
* launch geometry: ``programs(n_tiles, unit)``, i.e. how many Triton programs to launch for a
  given number of tiles, ``compute_units()`` (the grid of a one-program-per-SM persistent
  kernel), and ``tuning_dirs``, where its tuning tables live.

Subclass :class:`Backend` and override what differs; see ``backends/`` for four examples.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

Unit = Literal["vector", "cube"]
"""Which hardware unit a kernel feeds: element-wise ("vector") or matrix ("cube")."""

def _ops_tuning_root() -> Path:
    """The directory of the built-in tuning tables (``xkernels.ops``' data), in an editable or a
    wheel install, found without importing the ops: the contract sits below them."""
    spec = importlib.util.find_spec("xkernels.ops")
    if spec is None or spec.origin is None:
        raise RuntimeError("xkernels.ops is not installed: the built-in tuning tables cannot be found")
    return Path(spec.origin).resolve().parent / "tuning"


class BackendUnavailableError(RuntimeError):
    """A backend was asked for work but cannot run here; the message says why."""


class UnknownBackendError(ValueError):
    """A backend name that no registered plugin provides; the message lists the known ones."""


@dataclass(frozen=True)
class Figure:
    """A number with its provenance: ``"measured"`` on this device, or ``"datasheet"``."""

    value: float
    unit: str
    source: Literal["measured", "datasheet"]
    note: str = ""

    def __str__(self) -> str:
        extra = f", {self.note}" if self.note else ""
        return f"{self.value:g} {self.unit} ({self.source}{extra})"


@dataclass(frozen=True)
class DeviceProperties:
    """What a backend knows about one device. ``None`` means unknown, never a guess."""

    backend: str
    name: str
    arch: str
    compute_units: int | None
    compute_unit_kind: str
    memory_bytes: int | None
    max_programs_per_launch: int
    vector_units: int | None = None
    copy_bandwidth: Figure | None = None
    matmul_peak: Figure | None = None
    datasheet: dict[str, Figure] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        def conv(v: Any) -> Any:
            if isinstance(v, Figure):
                return {"value": v.value, "unit": v.unit, "source": v.source, "note": v.note}
            if isinstance(v, dict):
                return {k: conv(x) for k, x in v.items()}
            return v

        return {k: conv(v) for k, v in self.__dict__.items()}


class HostEvent:
    """A ``time.perf_counter`` event with the ``torch.cuda.Event`` interface, for host devices."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        """Host work is synchronous: nothing to wait for."""

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: HostEvent) -> float:
        """Milliseconds from this event to ``end``."""
        if self._t is None or end._t is None:
            raise RuntimeError("both events must be recorded before elapsed_time()")
        return (end._t - self._t) * 1e3


def default_allocator(device: torch.device) -> Callable[[tuple[int, ...], tuple[int, ...], torch.dtype],
                                                       torch.Tensor]:
    """``Backend.allocator``'s default (see there)."""
    direct = getattr(getattr(torch._C, "_dynamo", None), "guards", None)

    def general(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    if device.type == "cpu" and hasattr(direct, "_empty_strided_cpu"):
        return direct._empty_strided_cpu
    if device.type == "cuda" and device.index is not None and hasattr(direct, "_empty_strided_cuda"):
        on_current, index, current = direct._empty_strided_cuda, device.index, torch._C._cuda_getDevice

        def cuda(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            # the direct allocator takes the current device: any other goes the general way
            return on_current(size, stride, dtype) if current() == index else general(size, stride, dtype)
        return cuda
    return general


class Backend:
    """Base class of every backend. Subclasses set the class attributes and override methods."""

    #: Registry name, e.g. ``"cuda"``; what ``use_backend()`` and ``XKERNELS_BACKEND`` take.
    name: str = ""
    #: The torch device type whose tensors this backend serves (``"cuda"``, ``"npu"``, ``"cpu"``).
    device_type: str = ""
    #: Whether ops run their portable Triton kernels here (False: the PyTorch fallback).
    runs_triton: bool = False
    #: Bytes a pointer/stride must be a multiple of for full-width vector access.
    alignment: int = 16
    #: Bytes for operands of the matrix unit (Ascend cube: 512); defaults to ``alignment``.
    cube_alignment: int | None = None
    #: Triton launch options the backend honours (taken from a tuning config when present).
    launch_options: tuple[str, ...] = ("num_warps", "num_stages")
    #: Whether launches may call the cached ``CompiledKernel`` directly (see ``xkernels.launch``).
    fast_launch: bool = False
    #: Whether ``tl.dot`` takes bfloat16 operands as they are (False: the kernel upcasts first).
    native_bf16_dot: bool = True
    #: Whether a matmul/linear whose 2-D operand has a misaligned leading stride (rows not
    #: starting on ``alignment`` bytes, e.g. GPT-2's 768 x 50257 vocabulary matrix used as
    #: ``x @ W``) runs the device's own BLAS through torch instead of copying the operand into an
    #: aligned buffer first. True where that was measured faster (cuda: see results/README.md);
    #: False keeps the copy (and the kernel) everywhere else.
    misaligned_to_vendor: bool = False
    #: Whether a matmul whose A is M-contiguous (``grad.T @ x``, a weight gradient's layout: no
    #: tuning table measured it) runs the device's own BLAS unless a table rule names that
    #: layout (``"a_layout": "m-major"``). True where the kernel was measured slower there (cuda:
    #: 0.68x at BERT's FFN weight gradient on the H100, 2026-11-23); False keeps the kernel.
    m_major_a_to_vendor: bool = False
    #: Activations the device's BLAS applies in its own epilogue together with the bias
    #: (``torch._addmm_activation``: cuBLASLt's RELU_BIAS / GELU_BIAS, whose GELU is the tanh
    #: approximation): a float16/bfloat16 ``linear`` with one of these runs it (without a bias:
    #: with a zero one), where that was measured faster than the kernels (cuda:
    #: ``("relu", "gelu_tanh")``; over real-model layers 1.11x the kernel routes' geomean with a
    #: bias, 1.05x without, results/2026-11-23-h100-vendor-epilogue*). Empty: none.
    vendor_epilogues: tuple[str, ...] = ()
    #: Whether a matmul/linear kernel must be supported by measurement to run instead of the
    #: device's BLAS: a measured table rule covering the call, measured neighbours that agree,
    #: or a first-use check on the device (``ops/matmul/evidence.py``, docs/selection.md);
    #: otherwise the BLAS runs, whatever the wave model predicts. True where the backend has a
    #: BLAS to fall back on (cuda); False keeps the wave model's choice (nothing to compare with).
    kernel_needs_evidence: bool = False
    #: Host milliseconds one repeated matmul/linear call costs by each route (``"pointer"``,
    #: ``"split"``, ``"tma"`` kernels, ``"vendor"``: the device's BLAS), measured on this
    #: backend's host: the wave model and the first-use check compare routes by the longer of
    #: device time and this (``ops/matmul/config.host_ms``), and evidence whose measured BLAS
    #: device time is under ``"vendor"`` (launch-bound) must show the kernel
    #: ``evidence.LAUNCH_BOUND_MARGIN`` faster. Empty: device time alone decides.
    route_host_ms: dict[str, float] = {}  # noqa: RUF012 - read-only class data
    #: Host milliseconds a fused add + LayerNorm costs per training call (forward + backward,
    #: a Python autograd Function) beyond PyTorch's ``x + r`` and ``F.layer_norm``, measured on
    #: this backend's host. ``xkernels.patch``'s LayerNorm blocks train through the fused op in
    #: eager mode only where the bytes it saves take the device longer than this
    #: (``ops/fused/add_norm_plan.training_fusion_pays``). 0: always.
    fused_norm_training_host_ms: float = 0.0
    #: The same premium where the native extension records the fused call (``backends/native.py``:
    #: a C++ grad_fn, no Python autograd). 0: always.
    native_norm_training_host_ms: float = 0.0
    #: Host milliseconds an ``xkernels.nn.Linear`` costs per training call (forward + backward:
    #: a Python autograd Function, its backward GEMMs through ``xkernels.ops.matmul``) beyond
    #: ``torch.nn.Linear``'s, measured on this backend's host. Patched linears train through
    #: xkernels in eager mode only where the GEMM time a kernel could save is at least this
    #: (``xkernels.nn.training_pays``), else through ``F.linear``. 0: always.
    linear_training_host_ms: float = 0.0
    #: (fixed ms, fraction of the copy bandwidth): no GEMM estimate of the wave model's fitted
    #: costs falls below the fixed part plus its operand bytes streamed at that fraction (the
    #: fit knows waves, not the bandwidth they share). ``None``: the fit alone.
    stream_floor: tuple[float, float] | None = None
    #: Whether the device is the default choice for tensors of ``device_type``.
    default_for_device: bool = True
    #: Preference when ``bench``/``check`` pick "the best device present" (higher wins).
    priority: int = 0

    # -- identity ------------------------------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        """``None`` when the backend can run here, else a one-line human reason."""
        return None

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def require_available(self) -> None:
        reason = self.unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(f"xkernels backend {self.name!r} is not available: {reason}")

    # -- synchronisation and timing -------------------------------------------------------------
    def synchronize(self, device: torch.device | int | str | None = None) -> None:
        """Wait until all work queued on ``device`` has finished."""

    def Event(self, enable_timing: bool = True) -> Any:  # noqa: N802 - mirrors torch.cuda.Event
        """A timing event: ``e.record()``, ``start.elapsed_time(end)`` in milliseconds."""
        return HostEvent(enable_timing=enable_timing)

    def hold(self, microseconds: float) -> bool:
        """Queue device work that keeps the current stream busy for about ``microseconds``, so a
        timed call queued behind it is not measured waiting for the host; ``False`` where the
        backend has no way to (the timing then includes any host time the flush does not hide)."""
        return False

    def replayable(self, fn: Callable[[], Any]) -> Callable[[], Any] | None:
        """``fn`` recorded once so that calling the result re-runs its device work with no host
        work in between (a CUDA graph's replay), or ``None`` where the backend cannot record
        (the default) or ``fn`` cannot be recorded (it synchronises, or runs host code whose
        effect a replay would not repeat). For timing calls of a few microseconds, whose eager
        timings carry a launch-path bias of several percent (``xkernels.interleave``); ``fn``
        must be warm (compiled, its first-use checks settled) and its result is thrown away."""
        return None

    # -- memory alignment -----------------------------------------------------------------------
    def alignment_for(self, unit: Unit = "vector") -> int:
        if unit == "cube":
            return self.cube_alignment or self.alignment
        return self.alignment

    def is_aligned(self, tensor: torch.Tensor, unit: Unit = "vector") -> bool:
        """Whether ``tensor``'s pointer and every non-unit stride (in bytes) meet the alignment."""
        align = self.alignment_for(unit)
        if tensor.numel() == 0:
            return True
        if tensor.data_ptr() % align:
            return False
        esize = tensor.element_size()
        for size, stride in zip(tensor.shape, tensor.stride()):
            if size > 1 and stride not in (0, 1) and (stride * esize) % align:
                return False
        return True

    def tile_multiple(self, dtype: torch.dtype, unit: Unit = "vector") -> int:
        """Elements per aligned chunk: tile widths should be multiples of this."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return max(1, self.alignment_for(unit) // itemsize)

    # -- device properties ----------------------------------------------------------------------
    def properties(self, device: torch.device | int | str | None = None) -> DeviceProperties:
        raise NotImplementedError

    def arch(self, device: torch.device | int | str | None = None) -> str:
        """Architecture key of the tuning tables (``"sm90"``, ``"Ascend910B3"``, ...)."""
        return self.properties(device).arch

    def arch_fallbacks(self, arch: str) -> list[str]:
        """Table keys tried for ``arch`` before the backend's default entry (most specific first)."""
        return [arch]

    def fp32_matmul_precision(self) -> str:
        """Triton ``input_precision`` for float32 ``tl.dot``, matching torch's setting here."""
        return "ieee"

    def tensor_descriptors(self, device: Any = None) -> bool:
        """Whether kernels may load through Triton tensor descriptors (TMA) on ``device``."""
        return False

    def inline_ptx(self, device: Any = None) -> bool:
        """Whether kernels compiled for ``device`` may carry inline PTX (NVIDIA's assembly, through
        ``tl.inline_asm_elementwise``): a plan then picks the PTX form of an epilogue where one
        exists (the matmul's GELU); elsewhere the portable form runs."""
        return False

    # -- launch geometry ------------------------------------------------------------------------
    def max_programs(self, unit: Unit = "vector", device: Any = None) -> int:
        """Most programs one launch should use; a kernel loops over the rest (persistent)."""
        return 2**31 - 1

    def compute_units(self, device: Any = None) -> int | None:
        """Compute units of ``device`` that run matrix work (SMs, AI cores), the grid of a
        persistent kernel with one program per unit; ``None`` when unknown."""
        return self.properties(device).compute_units

    def programs(self, n_tiles: int, unit: Unit = "vector", device: Any = None) -> int:
        """Programs to launch for ``n_tiles`` tiles. Fewer than ``n_tiles`` means persistent."""
        return max(1, min(n_tiles, self.max_programs(unit, device)))

    def kernel(self, jit_fn: Any) -> Any:
        """The launchable form of a ``@triton.jit`` kernel on this backend (identity by default)."""
        return jit_fn

    # -- memory ---------------------------------------------------------------------------------
    def allocator(self, device: torch.device) -> Callable[[tuple[int, ...], tuple[int, ...], torch.dtype],
                                                          torch.Tensor]:
        """A function ``(size, stride, dtype) -> tensor`` allocating uninitialised memory on
        ``device``: hot entries allocate their results with it on every call. The default takes
        PyTorch's direct allocators where it has them (the ones ``torch.compile``'s generated code
        calls: CPU, and CUDA when ``device`` is the current device), which skip the dispatcher
        (about half the host time of ``torch.empty``), else ``torch.empty_strided``."""
        return default_allocator(device)

    # -- tuning ---------------------------------------------------------------------------------
    #: Name of the table set under ``ops/tuning/`` this backend reads (defaults to ``name``).
    tuning_name: str | None = None

    @property
    def tuning_dirs(self) -> tuple[Path, ...]:
        """Directories holding ``<op>.json`` tuning tables for this backend, searched in order."""
        return (_ops_tuning_root() / (self.tuning_name or self.name),)

    def __repr__(self) -> str:
        return f"<xkernels backend {self.name!r} device_type={self.device_type!r}>"
