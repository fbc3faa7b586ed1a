"""Training's ``linear`` + activation in one kernel: the GEMM's epilogue writes both
``act(x @ W.T + b)`` and the pre-activation ``x @ W.T + b`` that the backward reads.

Where a gradient is required, gelu, gelu_tanh, silu, quick_gelu, relu2 and leaky_relu with a negative slope need the
pre-activation in the backward (``ops/autograd.py``). Unfused, ``linear`` writes it and PyTorch's
activation reads it back and writes the output: one more pass over the (M, N) result. Here the
TMA kernel (``kernels.matmul_tma_pre_kernel``, the inference kernel plus one more tensor-descriptor
store of each tile before its activation) writes both from registers, so the pass's read is saved
and its write rides on the GEMM. The backward is ``LinearFunction``'s, fed the stored
pre-activation instead of recomputing it.

When it runs (:func:`plan_for`), everything else keeps the unfused form:

* the call's plan, as the same call without a gradient would run it, is the TMA kernel: no split
  K, no residual, no vendor BLAS, its config from a measured table rule or from a first-use check
  on this device that timed it against the BLAS route (``ops/matmul/evidence.py``; not for a
  launch-bound call, whose timings move by ~10% between runs);
* that measured speedup over PyTorch's ``F.linear`` + activation (the rule's ``worst_ratio``, the
  check's device ratio: ``evidence.measured_ratio``) still beats the unfused form after paying one
  more write of the result: with ``rho`` the result's write time over the GEMM's
  (``result_write_fraction``), the fused kernel plus that write beats the GEMM plus the
  activation's read and write when ``ratio > (1 + 2 rho) / (1 + rho)`` (:func:`pays`). At
  BERT's FFN shape (768 -> 3072, bf16) that asks for 1.21x on an H100; its rule records 1.264x.
  Measured there, the one kernel ran 1.17-1.19x the unfused form
  (results/2026-11-27-h100-training-pre-activation).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.dispatch import _override
from xkernels.launch import Launcher
from xkernels.ops.autograd import LinearFunction
from xkernels.ops.matmul import config as matmul_config
from xkernels.ops.matmul import evidence as matmul_evidence
from xkernels.tuning import _forced

#: Achieved GEMM throughput over the matmul peak the ridge point is computed from (cuBLAS runs
#: BERT's FFN up-projection at ~610 of the H100's 989 dense bf16 TFLOP/s): a GEMM's time is
#: estimated from it, so a lower value would make the result's write look cheaper.
GEMM_EFFICIENCY = 0.62

_MAX_PLANS = 256


def result_write_fraction(backend: Backend, device: torch.device, k: int, element_size: int) -> float:
    """``rho``: writing an (M, N) result over the (M, N, K) GEMM's time, ``element_size * ridge *
    GEMM_EFFICIENCY / (2 K)`` (the ridge point: matmul peak over copy bandwidth, FLOP per byte)."""
    return element_size * matmul_config._ridge(backend, device) * GEMM_EFFICIENCY / (2 * max(k, 1))


def pays(ratio: float, rho: float) -> bool:
    """Whether a fused kernel measured ``ratio`` x faster than the GEMM + activation still wins
    after writing the pre-activation too (the module doc)."""
    return ratio > (1 + 2 * rho) / (1 + rho)


class PreActivationPlan:
    """The launch of ``matmul_tma_pre_kernel`` for one call signature (the slope included): the
    grid, constexprs and options of ``plan`` (the call's own TMA plan), one more descriptor for
    the pre-activation. After the first launch compiled it, launches go through one C call that
    encodes the four tensor maps from the call's base pointers (``cuda_launch``, as the TMA
    plans' hot entries do), where that applies; else through Triton's launcher."""

    def __init__(self, plan: Any, backend: Backend, slope: float) -> None:
        from xkernels.ops.matmul import kernels as K

        self.plan = plan
        self.slope = float(slope)
        self.launcher = Launcher(backend.kernel(K.matmul_tma_pre_kernel), plan.grid, plan.constexprs, plan.options,
                                 backend.fast_launch, varying=(0, 1, 2, 3, 4))
        self._record: Any = None  # False: none applies

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 into: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(act(x @ weight.T + bias), x @ weight.T + bias), each of x's leading shape by N
        (``into``: two contiguous (M, N) buffers to write instead of fresh ones)."""
        n, k = weight.shape
        a = x.reshape(-1, k)
        b = weight.t()
        if into is None:
            y = torch.empty((a.shape[0], n), dtype=x.dtype, device=x.device)
            h = torch.empty_like(y)
        else:
            y, h = into
        shape = (*x.shape[:-1], n)
        record = self._record
        if (record and x.get_device() == torch.cuda.current_device()  # the record launches on the current device
                and record(a, weight, y, h, bias if bias is not None else y)):
            return y.view(shape), h.view(shape)
        from triton.tools.tensor_descriptor import TensorDescriptor

        if (a.data_ptr() | b.data_ptr()) & 15:  # TMA needs 16-byte bases (as MatmulPlan.launch)
            a = a.clone() if a.data_ptr() & 15 else a
            b = b.clone() if b.data_ptr() & 15 else b
        a_desc, b_desc, c_desc = self.plan.descriptors(a, b, y)
        h_desc = TensorDescriptor(h, list(h.shape), [h.stride(0), 1], self.plan.tma["c"])
        self.launcher(a_desc, b_desc, c_desc, h_desc, bias if bias is not None else y, *self.plan.dims, self.slope)
        if record is None:
            self._record = self._make_record(a, weight, bias) or False
        return y.view(shape), h.view(shape)

    def _make_record(self, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
        """The one-C-call launch of this signature's compiled kernel, or ``None`` (see the class
        doc; the weight is read K-contiguous, A row-major: ``plan_for``'s conditions)."""
        from xkernels.backends.cuda_launch import Descriptor

        t = self.plan.tma
        if t["a_mmajor"] or not t["b_kmajor"] or a.stride(1) != 1 or weight.stride(1) != 1:
            return None
        M, N, K = self.plan.dims
        spec_bias = bias if bias is not None else torch.empty(16, dtype=a.dtype, device=a.device)
        spec = (None, None, None, None, spec_bias, M, N, K, self.slope)
        out = Descriptor((M, N), (N, 1))
        return self.launcher.descriptor_record(spec, (0, 1, 2, 3, 4), {
            0: Descriptor((M, K), (a.stride(0), 1)), 1: Descriptor((N, K), (weight.stride(0), 1)), 2: out, 3: out})


class Remembered:
    """Plans (or ``None``: no fused form) remembered per call signature, the oldest dropped past
    ``limit``; nothing is remembered or reused under a forced tuning config."""

    def __init__(self, limit: int = _MAX_PLANS) -> None:
        self._plans: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self.limit = limit

    def get(self, key: Any, make: Any) -> Any:
        """The plan of ``key``, made by ``make()`` the first time."""
        forced = _forced.get() is not None
        if not forced:
            found = self._plans.get(key, False)
            if found is not False:
                return found
        made = make()
        if not forced:
            with self._lock:
                self._plans[key] = made
                while len(self._plans) > self.limit:
                    self._plans.pop(next(iter(self._plans)))
        return made

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()


_plans = Remembered()


def plan_for(op: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
             slope: float) -> PreActivationPlan | None:
    """The fused training forward for this call of ``op`` (``xkernels.ops.linear``), or ``None``
    where the unfused form runs (the module doc). Remembered per signature, backend override and
    the op's generation; not under a forced tuning config."""
    key = (op.generation, _override.get(), x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(),
           weight.dtype, None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
           activation, slope)
    return _plans.get(key, lambda: _make(op, x, weight, bias, activation, slope))


def _make(op: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
          slope: float) -> PreActivationPlan | None:
    if x.dtype not in (torch.float16, torch.bfloat16) or x.dim() < 2 or not x.is_contiguous():
        return None
    call = op.check(x, weight, bias, activation, negative_slope=slope)
    backend, plan = op._decide(call)
    if backend is None or not _tma_kernel(plan):
        return None
    if _forced.get() is None and not eligible(plan, backend, x.device, x.element_size()):
        return None
    return PreActivationPlan(plan, backend, slope)


def _tma_kernel(plan: Any) -> bool:
    """Whether ``plan`` is the TMA kernel without split K, residual or a materialized batch."""
    return (getattr(plan, "tma", None) is not None and not plan.vendor and plan.split_k == 1 and plan.res is None
            and not plan.materialize)


def describe(x: torch.Tensor, call: Any, backend: Any, plan: Any) -> str:
    """How a checked ``linear`` call (of input ``x``) whose activation needs the pre-activation
    runs where a gradient is required, for ``explain()`` (``plan``: the call's, as ``explain``
    decided it)."""
    unfused = f"linear without activation, then PyTorch's {call.activation} (its backward reads the pre-activation)"
    if backend is None or not _tma_kernel(plan):
        return f"{unfused}: the call's plan is not the TMA kernel"
    if x.dtype not in (torch.float16, torch.bfloat16) or x.dim() < 2 or not x.is_contiguous():
        return f"{unfused}: the fused training form takes a contiguous fp16/bf16 x"
    if tuning.forced_config() is None and not eligible(plan, backend, call.device, x.element_size()):
        ratio = matmul_evidence.measured_ratio(plan.selection)
        rho = result_write_fraction(backend, call.device, plan.dims[2], x.element_size())
        what = "a first-use check's" if plan.selection.record.get("first_use_ratio") is not None else "the rule's"
        return (f"{unfused}: {what} measured speedup ({ratio}) does not pay for one more write of the result "
                f"(needs > {(1 + 2 * rho) / (1 + rho):.3f})")
    return ("one kernel writes the output and the pre-activation the backward reads (ops/matmul/pre_activation.py): "
            + plan.variant.replace(", tiles loaded", " (the pre-activation stored too), tiles loaded", 1))


def eligible(plan: Any, backend: Backend, device: torch.device, element_size: int) -> bool:
    """Whether a call with ``plan`` (its TMA plan, unforced) runs fused in training: the table
    rule behind the plan, or the first-use check on this device that chose its kernel
    (``evidence.measured_ratio``), measured a speedup that still pays for the extra write
    (:func:`pays`)."""
    ratio = matmul_evidence.measured_ratio(plan.selection)
    if ratio is None:
        return False
    return pays(ratio, result_write_fraction(backend, device, plan.dims[2], element_size))


def recorded(op: Any, mm: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
             slope: float) -> torch.Tensor | None:
    """``act(x @ weight.T + bias)`` recorded by autograd with the pre-activation from the one
    kernel, or ``None`` where the unfused form runs (nothing is launched then)."""
    pre = plan_for(op, x, weight, bias, activation, slope)
    if pre is None:
        return None
    return LinearFunction.apply(pre, mm, op, x, weight, bias, activation, slope)


def forget() -> None:
    """Drop the remembered plans (tests; the op's generation already retires stale ones)."""
    _plans.clear()
