"""CUDA backend: NVIDIA GPUs through Triton's NVIDIA driver; timing with torch.cuda events."""

from __future__ import annotations

import functools
from typing import Any

import torch

from xkernels.backend import Backend, DeviceProperties, Figure
from xkernels.hookspecs import hookimpl

# Vendor datasheet figures (SXM parts, dense, no sparsity); labelled "datasheet" wherever shown.
DATASHEET: dict[str, dict[str, Figure]] = {
    "H100": {
        "hbm_bandwidth": Figure(3350, "GB/s", "datasheet", "H100 SXM5 80GB HBM3"),
        "bf16_tflops": Figure(989, "TFLOP/s", "datasheet", "dense bf16/fp16"),
        "tf32_tflops": Figure(495, "TFLOP/s", "datasheet", "dense tf32"),
    },
    "H200": {
        "hbm_bandwidth": Figure(4800, "GB/s", "datasheet", "H200 SXM 141GB HBM3e"),
        "bf16_tflops": Figure(989, "TFLOP/s", "datasheet", "dense bf16/fp16"),
        "tf32_tflops": Figure(495, "TFLOP/s", "datasheet", "dense tf32"),
    },
    "A100": {
        "hbm_bandwidth": Figure(2039, "GB/s", "datasheet", "A100 SXM4 80GB"),
        "bf16_tflops": Figure(312, "TFLOP/s", "datasheet", "dense bf16/fp16"),
        "tf32_tflops": Figure(156, "TFLOP/s", "datasheet", "dense tf32"),
    },
}


def _index(device: Any) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    return dev.index if dev.index is not None else torch.cuda.current_device()


@functools.cache
def _device_properties(index: int) -> Any:
    return torch.cuda.get_device_properties(index)


def _restore_generator() -> None:
    """After a failed capture: one trivial capture that completes, so the default CUDA
    generator's capture state is closed again (a failed one leaves it open)."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            torch.empty(1, device="cuda").zero_()
    except Exception:  # noqa: BLE001 - best effort: nothing more can be done here
        pass


class CudaBackend(Backend):
    name = "cuda"
    device_type = "cuda"
    runs_triton = True
    alignment = 16  # 128-bit loads (ld.global.v4)
    fast_launch = True
    misaligned_to_vendor = True  # cuBLAS reads misaligned rows in place; the copy cost 0.35-0.64x (H100, 2026-11-23)
    kernel_needs_evidence = True  # cuBLAS is there: a kernel runs only on measured evidence
    m_major_a_to_vendor = True  # the TMA kernel on grad.T ran 0.68x cuBLAS (H100, 2026-11-23); no table measured it
    # cuBLASLt's bias + relu / tanh-GELU epilogues (results/2026-11-23-h100-vendor-epilogue*: 1.24x torch unfused,
    # 1.11x the kernels with a bias; 1.17x / 1.05x with a zero bias for layers without one); ROCm's
    # hipBLASLt is another library, not measured
    vendor_epilogues = ("relu", "gelu_tanh") if torch.version.hip is None else ()
    priority = 20
    #: Host ms per repeated call by route, H100 host (results/2026-11-23-h100-call-forms-host/
    #: forms-host-probe.txt): a pointer kernel's launch record 9.2 us and ``F.linear`` 13.7 us per
    #: back-to-back call. A TMA kernel's record also encodes its three tensor maps per call: 17.1-19.2
    #: us where ``F.linear`` took 22.7-27.2 and pointer entries 15.4-17.4 on a slower host moment,
    #: 10.4 at the call-forms run's scale. A split-K plan is two record launches and a workspace
    #: (estimated: a pointer launch plus the record alone, 4.2 us). The vendor figure is
    #: ``F.linear``'s own: through xkernels' front door the BLAS route costs a few us more, left out
    #: on purpose, so that a near tie goes to the BLAS, whose device time is what the bench measures
    #: (with it, Gemma's qkv at 77 tokens would take its 0.88x-device kernel again). Another host
    #: scales all four alike; the ratios between routes are what the decisions use.
    route_host_ms = {"pointer": 0.0092, "split": 0.0134, "tma": 0.0104, "vendor": 0.0137}  # noqa: RUF012
    #: The fitted costs promise more than the memory delivers at few rows, where a GEMM is a
    #: stream of its weights (held-out 1-token GEMMs estimated 30-45% under their time; OPT-1.3B's
    #: qkv at 77 tokens 16.7 us estimated, 22.6 measured; H100, 2026-11-23). The floor is the
    #: envelope of the fastest GEMM, xkernels' or cuBLAS's, on each of the 61 bf16 shapes of 1-128
    #: tokens in results/2026-11-23-h100-linear-corpus-bf16: 7.85 us + bytes / 2.42 TB/s fits every
    #: one within -10%/+15% (0.81 of the 3.0 TB/s copy bandwidth); the fixed part is taken a
    #: little lower, 7 us, the fastest 1.2 MB GEMM measured (7.5 us).
    stream_floor = (0.007, 0.80)
    #: add_layer_norm forward + backward 470.9 us against PyTorch's x + r, F.layer_norm and their
    #: backward 265.8 us per call, medians with the device held busy (H100 host, 2026-11-24,
    #: results/2026-11-24-h100-training-host): BERT-base's 24 such blocks cost its training step
    #: ~4.9 ms of host time, its whole wall-time deficit (results/2026-11-24-h100-models-eager-host-path).
    fused_norm_training_host_ms = 0.205
    #: Recorded by the native grad_fn the same call cost 308 us against PyTorch's 329 (autograd's
    #: threads on; 257 against 245 with them off), medians of valid rounds with the device held
    #: busy (H100 host, 2026-11-25, results/2026-11-25-h100-native-add-norm): no premium.
    native_norm_training_host_ms = 0.0
    #: xkernels.nn.Linear forward + backward 300.5 us against torch.nn.Linear's 256.0 us per call,
    #: medians with the device held busy (H100 host, 2026-11-24, results/2026-11-24-h100-training-host);
    #: BERT-base's 72 linears: its patched training step took ~4 ms more host than torch's (35.4 vs
    #: 31.3 ms, results/2026-11-25-h100-models-eager-host-column).
    linear_training_host_ms = 0.045

    @functools.cache  # noqa: B019 - one backend object per process
    def unavailable_reason(self) -> str | None:
        if not torch.cuda.is_available():
            return (f"torch {torch.__version__} sees no CUDA device "
                    f"(torch.version.cuda={torch.version.cuda})")
        try:
            import triton
            from triton.runtime import driver
        except ImportError as exc:
            return f"Triton is not importable ({exc}); install it: pip install 'xkernels[triton]'"
        try:
            target = driver.active.get_current_target()
        except Exception as exc:  # no usable driver
            return f"Triton {triton.__version__} has no active GPU driver: {exc}"
        if target.backend != "cuda":
            return f"Triton {triton.__version__}'s active driver targets {target.backend!r}, not cuda"
        return None

    def synchronize(self, device: Any = None) -> None:
        torch.cuda.synchronize(device)

    def Event(self, enable_timing: bool = True) -> Any:  # noqa: N802
        return torch.cuda.Event(enable_timing=enable_timing)

    def hold(self, microseconds: float) -> bool:
        sleep = getattr(torch.cuda, "_sleep", None)  # a spin kernel of N clock cycles
        if sleep is None:
            return False
        sleep(int(microseconds * 2000))  # cycles at 2 GHz, about the top boost clock of current parts
        return True

    def replayable(self, fn: Any) -> Any:
        """A CUDA graph of one ``fn()``, its ``replay``; ``None`` where ``fn`` cannot be captured.
        ``fn`` first runs once on a side stream (as capture requires) under
        ``torch.cuda.set_sync_debug_mode("error")``, so that a call that synchronises is refused
        before any capture starts: a capture that fails midway leaves the CUDA generator in
        capture mode, and every later random op of the process fails ("Offset increment outside
        graph capture"). The debug mode is process-wide for that one call: a timing utility of
        the harness, not for concurrent use. Capture errors are thread-local."""
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        before = torch.cuda.get_sync_debug_mode()
        try:
            torch.cuda.set_sync_debug_mode("error")
            with torch.cuda.stream(side):
                fn()
        except Exception:  # noqa: BLE001 - it synchronises (or fails): the caller times it eagerly
            torch.cuda.synchronize()
            return None
        finally:
            torch.cuda.set_sync_debug_mode(before)
        torch.cuda.current_stream().wait_stream(side)
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                fn()
        except Exception:  # noqa: BLE001 - not capturable: the caller times it eagerly
            torch.cuda.synchronize()
            _restore_generator()
            return None
        return graph.replay

    def _props(self, index: int) -> DeviceProperties:
        from xkernels import peaks

        p = _device_properties(index)
        sheet = next((v for k, v in DATASHEET.items() if k in p.name), {})
        return DeviceProperties(
            backend=self.name,
            name=p.name,
            arch=f"sm{p.major}{p.minor}",
            compute_units=p.multi_processor_count,
            compute_unit_kind="SM",
            memory_bytes=p.total_memory,
            max_programs_per_launch=2**31 - 1,
            copy_bandwidth=peaks.cached_figure(self.name, p.name, "copy_bandwidth"),
            matmul_peak=peaks.cached_figure(self.name, p.name, "matmul_peak"),
            datasheet=dict(sheet),
            extra={"l2_bytes": getattr(p, "L2_cache_size", None), "capability": f"{p.major}.{p.minor}"},
        )

    def properties(self, device: Any = None) -> DeviceProperties:
        self.require_available()
        return self._props(_index(device))

    def fp32_matmul_precision(self) -> str:
        # torch.backends.cuda.matmul.allow_tf32 mirrors torch.set_float32_matmul_precision
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"

    def arch(self, device: Any = None) -> str:
        major, minor = torch.cuda.get_device_capability(_index(device))
        return f"sm{major}{minor}"

    def compute_units(self, device: Any = None) -> int | None:
        return _device_properties(_index(device)).multi_processor_count  # SMs, cached per device

    def tensor_descriptors(self, device: Any = None) -> bool:
        # the TMA engine is sm90+; host-side descriptors need triton.tools.tensor_descriptor (3.4+)
        return int(self.arch(device)[2:]) >= 90 and _has_tensor_descriptor()

    def inline_ptx(self, device: Any = None) -> bool:
        # Triton compiles to PTX for NVIDIA; a ROCm build of torch runs this backend on AMD GPUs
        return torch.version.hip is None


@functools.cache
def _has_tensor_descriptor() -> bool:
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


@hookimpl
def xkernels_add_backends() -> list[Backend]:
    return [CudaBackend()]
