"""``gated_linear`` inside a ``torch.compile`` graph, launched as a user-defined Triton kernel.

Under compile a patched gated MLP traces its class's own forward (``xkernels.blocks``), which
Inductor turns into the device's GEMMs for gate and up and one fused ``act(gate) * up`` pass: the
op's vendor route. Where the op's table measured its fused kernel faster than that route (on sm90,
1-64 tokens: the GEMMs are bound by reading the weights there, and the fused kernel reads x once
and never writes gate and up), the traced code launches the fused kernel itself, as
``ops/matmul/compiled.py`` launches linear + activation: Dynamo records a user-defined Triton
kernel and Inductor calls it from its generated code, with no custom op's Python at run time.

The launch is decided when Dynamo traces (:func:`launch_spec`, a constant of the graph): the
call's plan for its backend and device, exactly as eager mode plans it. It is used where

* the plan is the fused kernel from a measured table rule whose worst speedup over the vendor
  route is at least the launch's margin: 1.0 for the pointer kernel (launched from Inductor's
  code as Inductor's own kernels are, in place of three launches), ``compiled.MIN_RATIO`` for the
  TMA kernel (its descriptors are made in Python per call: about 25 us of host,
  results/2026-11-27-h100-compiled-ffn-kernel);
* x, the weights and the biases are contiguous, the TMA kernel's weights whole tensors (halves of
  one ``gate_up`` weight take the pointer kernel's rule, else the class's forward);
* every dim is static.

The caller (``block_steps.GatedStep.compiled``) asks only for inference calls outside autocast.
Elsewhere ``None``, and the class's own forward is traced.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

from xkernels import dispatch, tuning
from xkernels.ops.matmul.compiled import MIN_RATIO

#: the worst measured speedup over the vendor route the pointer kernel's launch needs (module doc)
POINTER_MIN_RATIO = 1.0


class LaunchSpec(NamedTuple):
    """What the traced code launches: the grid, the kernel's constexprs and launch options, the
    pointer kernel's tile count and strides (or the TMA kernel's descriptor blocks), and the
    plan's ``explain`` variant."""

    grid: int
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    tiles: int
    strides: tuple[int, ...]  # the pointer kernel's (x, wg, wu, y, bg, bu); () for the TMA kernel
    tma: tuple[tuple[int, ...], ...] | None  # (x, w, y) descriptor blocks; None: the pointer kernel
    variant: str


def launch_spec(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, concatenated: bool,
                has_bias: bool, has_up_bias: bool, activation: str) -> LaunchSpec | None:
    """The launch of a contiguous (m, k) x and (n, k) gate and up weights (``concatenated``: one
    contiguous (2n, k) weight, gate rows first), or ``None`` where the compiled graph keeps the
    class's own forward (the module doc). Marked for Dynamo as a constant: called, not traced."""
    if tuning.forced_config() is not None:
        return None
    from xkernels.ops.fused.gated_linear import gated_linear

    return _spec(m, k, n, dtype, device, concatenated, has_bias, has_up_bias, activation, dispatch.override_name(),
                 gated_linear.generation)


launch_spec._dynamo_marked_constant = True  # type: ignore[attr-defined]  # as ops/matmul/compiled.py's


@functools.lru_cache(maxsize=256)
def _spec(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, concatenated: bool, has_bias: bool,
          has_up_bias: bool, activation: str, override: str | None, generation: int) -> LaunchSpec | None:
    import dataclasses

    from xkernels.ops.fused.gated_linear import gated_linear

    try:
        backend = dispatch.select(device)
    except Exception:  # noqa: BLE001 - no backend for this device: the class's own forward
        return None
    if not backend.runs_triton or m == 0 or n == 0 or k == 0:
        return None
    meta = dict(dtype=dtype, device="meta")
    rows = 2 * n if concatenated else n
    call = gated_linear.check(torch.empty((m, k), **meta), torch.empty((rows, k), **meta),
                              None if concatenated else torch.empty((n, k), **meta),
                              torch.empty((rows,), **meta) if has_bias else None,
                              torch.empty((n,), **meta) if has_up_bias and not concatenated else None, activation)
    if not call.kernel_ok:
        return None
    call = dataclasses.replace(call, device=device)  # planned for the real device (its SMs, its table)
    plan = gated_linear.make_plan(call, backend)
    ratio = plan.record.get("worst_ratio") if plan.measured else None
    if plan.vendor or not isinstance(ratio, int | float):
        return None
    if plan.tma is not None:
        if concatenated or ratio < MIN_RATIO:
            return None
        return LaunchSpec(plan.programs, tuple(plan.constexprs.items()), tuple(plan.options.items()), plan.tiles,
                          (), (tuple(plan.tma["x"]), tuple(plan.tma["w"]), tuple(plan.tma["y"])), plan.variant)
    if ratio < POINTER_MIN_RATIO:
        return None
    return LaunchSpec(plan.programs, tuple(plan.constexprs.items()), tuple(plan.options.items()), plan.tiles,
                      tuple(plan.strides), None, plan.variant)


def _plain(t: torch.Tensor | None, dims: int) -> bool:
    return t is None or (t.dim() == dims and t.is_contiguous() and all(isinstance(s, int) for s in t.shape))


def gated(x: torch.Tensor, weight: torch.Tensor, up_weight: torch.Tensor | None, bias: torch.Tensor | None,
          up_bias: torch.Tensor | None, activation: str, *, views: bool = False) -> torch.Tensor | None:
    """``act(x @ Wg.T + bg) * (x @ Wu.T + bu)`` (``gated_linear``'s arguments) as one launch of the
    fused kernel in the graph being traced, or ``None`` where the class's own forward should be
    traced (the module doc). ``views``: the weights are halves of one projection's (the TMA
    kernel then declines). Called while Dynamo traces: nothing here may break its graph
    (``storage_offset`` would)."""
    if x.dim() < 2 or not _plain(x, x.dim()) or not _plain(weight, 2) or not _plain(up_weight, 2):
        return None
    if not (_plain(bias, 1) and _plain(up_bias, 1)):
        return None
    concatenated = up_weight is None
    if concatenated and up_bias is not None:
        return None
    if any(t is not None and t.dtype != x.dtype for t in (weight, up_weight, bias, up_bias)):
        return None
    rows, k = weight.shape
    n = rows // 2 if concatenated else rows
    if x.shape[-1] != k or (concatenated and rows % 2) or (up_weight is not None and up_weight.shape != weight.shape):
        return None
    m = x.numel() // k if k else 0
    spec = launch_spec(m, k, n, x.dtype, x.device, concatenated, bias is not None, up_bias is not None, activation)
    if spec is None:
        return None
    from xkernels.ops.fused import gated_linear_kernels as GK

    x2 = x.reshape(m, k)
    if concatenated:
        wg, wu = weight[:n], weight[n:]
        bg, bu = (None, None) if bias is None else (bias[:n], bias[n:])
    else:
        wg, wu, bg, bu = weight, up_weight, bias, up_bias
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    consts, options = dict(spec.constexprs), dict(spec.options)
    if spec.tma is not None:
        if views:
            return None
        from triton.tools.tensor_descriptor import TensorDescriptor

        xb, wb, yb = (list(b) for b in spec.tma)
        yd = TensorDescriptor.from_tensor(y, yb)
        GK.gated_linear_tma_kernel[(spec.grid,)](
            TensorDescriptor.from_tensor(x2, xb), TensorDescriptor.from_tensor(wg, wb),
            TensorDescriptor.from_tensor(wu, wb), yd, yd, yd, bg if bg is not None else y,
            bu if bu is not None else y, m, n, k, **consts, **options)
    else:
        GK.gated_linear_kernel[(spec.grid,)](
            x2, wg, wu, y, bg if bg is not None else y, bu if bu is not None else y, y, y, m, n, k, spec.tiles,
            spec.grid, *spec.strides, **consts, **options)
    return y.view(*x.shape[:-1], n)
