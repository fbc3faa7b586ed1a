"""``linear`` + activation inside a ``torch.compile`` graph, launched as a user-defined Triton kernel.

Under compile a patched linear layer traces PyTorch's ``F.linear`` and activation, which Inductor
turns into its GEMM (cuBLAS) and one fused bias + activation pass: the same bytes as eager
PyTorch. Where the activation rides on xkernels' TMA kernel and the table measured that kernel
clearly faster than ``F.linear`` + activation (BERT's and ViT's FFN up-projection with gelu: 1.3x
on an H100), the traced code instead launches ``kernels.matmul_tma_kernel`` itself: Dynamo
records a user-defined Triton kernel (``TensorDescriptor.from_tensor`` descriptors, Triton's
stable TMA API) and Inductor calls it from its generated code, with no custom op's Python kernel
at run time (an ``xkernels::linear`` node there cost BERT-base's compiled forward more host
time than it saved device time: results/2026-11-27-h100-compile-ffn-node).

The launch is decided when Dynamo traces (:func:`launch_spec`, a constant of the graph, as the
shapes, dtypes and device are): the call's plan for its backend and device, exactly as eager
mode plans it. It is used where

* no gradient is required (a training call keeps PyTorch's ops, whose backward Inductor fuses);
* the plan is the TMA kernel (one 2-D GEMM: no split K, residual or copies), with an
  activation in its epilogue, chosen by a measured table rule whose speedup over ``F.linear`` +
  activation (``worst_ratio``) is at least :data:`MIN_RATIO`;
* every dim is static (a dynamic dim keeps PyTorch's ops).

Elsewhere ``None``. An inference call whose activation eager mode leaves to the device BLAS's
epilogue (relu and gelu_tanh on cuda: GPT-2's MLP) then traces ``torch._addmm_activation``
(:func:`blas_epilogue`), which Inductor keeps as one BLAS call; any other call traces
``F.linear`` + activation.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

from xkernels import dispatch, tuning

#: The table's measured speedup a compiled launch needs: Inductor's pair (its GEMM, one fused bias +
#: activation pass) moves the bytes eager PyTorch's does, and the margin pays for the launch's host
#: time (about 25 us more than that pair's on an H100 host: results/2026-11-27-h100-compiled-ffn-kernel).
MIN_RATIO = 1.05


class LaunchSpec(NamedTuple):
    """What the traced code launches: the grid, the kernel's constexprs and launch options, the
    descriptors' block shapes, and the plan's ``explain`` variant."""

    grid: int
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    a_block: tuple[int, ...]
    b_block: tuple[int, ...]
    c_block: tuple[int, ...]
    variant: str


def launch_spec(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, has_bias: bool,
                activation: str, slope: float) -> LaunchSpec | None:
    """The launch of a contiguous (m, k) x, a K-contiguous (n, k) weight and a contiguous bias, or
    ``None`` where the compiled graph keeps PyTorch's ops (the module doc). Marked for Dynamo as
    ``torch.compiler.assume_constant_result`` marks a function: it is called, not traced."""
    if tuning.forced_config() is not None:
        return None
    from xkernels.ops.matmul.ops import linear

    return _spec(m, k, n, dtype, device, has_bias, activation, float(slope), dispatch.override_name(),
                 linear.generation)


# what ``torch.compiler.assume_constant_result`` sets (Dynamo calls the function and keeps its
# result instead of tracing it); set directly: importing torch._dynamo costs every import of the
# ops about a second (tests/ops/matmul/test_compiled.py checks the two agree)
launch_spec._dynamo_marked_constant = True  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=256)
def _spec(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, has_bias: bool, activation: str,
          slope: float, override: str | None, generation: int) -> LaunchSpec | None:
    from xkernels.ops.matmul.ops import linear

    try:
        backend = dispatch.select(device)
    except Exception:  # noqa: BLE001 - no backend for this device: PyTorch's ops
        return None
    if not backend.runs_triton or not backend.tensor_descriptors(device):
        return None
    meta = dict(dtype=dtype, device="meta")
    call = linear.check(torch.empty((m, k), **meta), torch.empty((n, k), **meta),
                        torch.empty((n,), **meta) if has_bias else None, activation, negative_slope=slope)
    if not call.kernel_ok:
        return None
    import dataclasses

    call = dataclasses.replace(call, device=device)  # planned for the real device (its SMs, its table)
    plan = linear.make_plan(call, backend)
    ratio = plan.selection.record.get("worst_ratio") if plan.measured else None
    if (plan.vendor or plan.tma is None or plan.split_k != 1 or plan.res is not None or plan.materialize
            or plan.tma["a_mmajor"] or not plan.tma["b_kmajor"] or not isinstance(ratio, int | float)
            or ratio < MIN_RATIO):
        return None
    return LaunchSpec(plan.grid[0], tuple(plan.constexprs.items()), tuple(plan.options.items()),
                      tuple(plan.tma["a"]), tuple(plan.tma["b"]), tuple(plan.tma["c"]), plan.variant)


def linear_activation(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
                      slope: float) -> torch.Tensor | None:
    """``act(x @ weight.T + bias)`` as one launch of the TMA kernel in the graph being traced, or
    ``None`` where PyTorch's ops should be traced (the module doc). Called while Dynamo traces."""
    if x.dim() < 2 or weight.dim() != 2 or not x.is_contiguous() or weight.stride(-1) != 1:
        return None
    if bias is not None and (bias.dim() != 1 or bias.stride(0) != 1):
        return None
    sizes = (*x.shape, *weight.shape)
    if not all(isinstance(s, int) for s in sizes):  # a dynamic dim: PyTorch's ops
        return None
    n, k = weight.shape
    m = x.numel() // k if k else 0
    if m == 0 or x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        return None
    spec = launch_spec(m, k, n, x.dtype, x.device, bias is not None, activation, slope)
    if spec is None:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    from xkernels.ops.matmul import kernels as K

    a = x.reshape(m, k)
    c = torch.empty((m, n), dtype=x.dtype, device=x.device)
    K.matmul_tma_kernel[(spec.grid,)](
        TensorDescriptor.from_tensor(a, list(spec.a_block)), TensorDescriptor.from_tensor(weight, list(spec.b_block)),
        TensorDescriptor.from_tensor(c, list(spec.c_block)), bias if bias is not None else c, m, n, k, float(slope),
        **dict(spec.constexprs), **dict(spec.options))
    return c.view(*x.shape[:-1], n)


def vendor_epilogue(dtype: torch.dtype, device: torch.device, activation: str) -> bool:
    """Whether an inference call of ``activation(x @ W.T + b)`` traces as the device BLAS's GEMM
    with the bias and activation in its own epilogue (``torch._addmm_activation``, which Inductor
    keeps as one call of the BLAS), as eager mode runs it: fp16 / bf16, an activation the BLAS
    applies (``vendor.BLAS_EPILOGUES``) and the backend lists (``Backend.vendor_epilogues``: relu
    and gelu_tanh on cuda), no forced config. Inductor's own form of ``F.linear`` + activation is
    its GEMM and one more pass over the output for the bias and the activation. A Dynamo constant,
    as :func:`launch_spec`."""
    from xkernels.ops.matmul.vendor import BLAS_EPILOGUES

    if tuning.forced_config() is not None or activation not in BLAS_EPILOGUES or dtype not in (torch.float16,
                                                                                                 torch.bfloat16):
        return False
    try:
        backend = dispatch.select(device)
    except Exception:  # noqa: BLE001 - no backend for this device: PyTorch's ops
        return False
    return backend.runs_triton and activation in backend.vendor_epilogues


vendor_epilogue._dynamo_marked_constant = True  # type: ignore[attr-defined]


def blas_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  activation: str) -> torch.Tensor | None:
    """``act(x @ weight.T + bias)`` as the BLAS's GEMM with its epilogue in the graph being traced
    (:func:`vendor_epilogue`), or ``None`` where PyTorch's ops should be traced. Any weight
    layout (GPT-2's ``Conv1D`` passes its weight transposed); a missing bias is a zero one."""
    if x.dim() < 2 or weight.dim() != 2 or (bias is not None and bias.dim() != 1):
        return None
    if not all(isinstance(s, int) for s in (*x.shape, *weight.shape)):  # a dynamic dim: PyTorch's ops
        return None
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype) or x.shape[-1] != weight.shape[1]:
        return None
    if x.numel() == 0 or not vendor_epilogue(x.dtype, x.device, activation):
        return None
    from xkernels.ops.matmul.vendor import BLAS_EPILOGUES

    n, k = weight.shape
    b = bias if bias is not None else x.new_zeros(n)
    y = torch._addmm_activation(b, x.reshape(-1, k), weight.t(), use_gelu=BLAS_EPILOGUES[activation])
    return y.view(*x.shape[:-1], n)
