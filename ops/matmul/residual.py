"""``linear``'s residual epilogue: ``act(x @ weight.T + bias) + residual`` in one call.

A transformer sublayer ends with ``residual + proj(h)``: PyTorch writes the GEMM's result, then
reads it and the residual and writes the sum. Here the residual is added where the result is
made:

* **Triton kernels** (pointer, sm90 TMA, split-K reduction): the epilogue loads the residual tile
  after the activation, adds it in fp32 and rounds once to the result dtype. Any strides: the
  residual is broadcast to the output (stride 0 where broadcast) and its leading dims collapsed
  to one row stride (``RES=1``) or two (``RES=2``: rows in groups of ``R1``, e.g. a ``(B, 1, N)``
  residual over ``(B, S, N)``); one that collapses to neither is copied to contiguous rows first.
* **Vendor BLAS**: without bias and activation, ``torch.addmm(residual, x, weight.T)`` (the BLAS
  computes ``x @ W.T + C`` with beta = 1); with ``out=`` the residual itself (and a contiguous
  one) it is ``residual.addmm_(x, weight.T)``: one GEMM that reads and writes it in place.
  Out of place, PyTorch copies the residual into the result before the GEMM (unless cuBLASLt
  takes it as a separate C), as many bytes as torch's own add. With a bias and/or activation:
  the vendor epilogue (``F.linear`` + activation, or ``torch._addmm_activation``), then the
  residual added in place into that fresh result.

The result dtype is torch's promotion of ``F.linear``'s and the residual's (a 0-d residual does
not promote); this module checks the residual and computes both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from xkernels.ops import checks
from xkernels.ops.layout import INT32_MAX, collapse, max_offset

if TYPE_CHECKING:
    from xkernels.ops.matmul.ops import MatmulCall


def result_dtype(x_dtype: torch.dtype, residual: torch.Tensor) -> torch.dtype:
    """torch's dtype of ``F.linear(x, ...) + residual`` (the linear result has at least one dim)."""
    if residual.dim() == 0:  # a 0-d tensor of the same category does not promote a dimensioned one
        return x_dtype
    return torch.promote_types(x_dtype, residual.dtype)


def check(residual: Any, out_shape: torch.Size, x_dtype: torch.dtype, out: Any) -> torch.dtype:
    """Validate ``residual`` (a floating tensor that broadcasts to the output without growing it;
    ``out``'s dtype must be the promoted one) and return the result dtype. Devices are checked
    with the other operands."""
    checks.require_tensor("linear", "residual", residual)
    if not residual.dtype.is_floating_point:
        raise TypeError(f"xkernels.ops.linear: 'residual' must be a floating-point tensor, got dtype "
                        f"{residual.dtype}")
    shape = tuple(out_shape)
    try:
        grown = tuple(checks.broadcast_shape("linear", {"result": out_shape, "residual": residual.shape}))
    except ValueError:
        grown = None
    if grown != shape:
        raise ValueError(f"xkernels.ops.linear: 'residual' of shape {tuple(residual.shape)} does not broadcast to "
                         f"the result of shape {shape}" + ("" if grown is None else f" (it would grow it to {grown})")
                         + "; the residual must broadcast to act(x @ weight.T + bias)'s shape")
    dtype = result_dtype(x_dtype, residual)
    if isinstance(out, torch.Tensor) and dtype != x_dtype and out.dtype != dtype:
        raise TypeError(f"xkernels.ops.linear: 'residual' of dtype {residual.dtype} promotes the result to {dtype}, "
                        f"'out' has dtype {out.dtype}")
    return dtype


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def reject_operand_out(out: Any, named: dict[str, torch.Tensor]) -> None:
    """``out=`` may be the residual (in place: each element is read by the program that writes it),
    never an operand of the product (``x``, ``weight``, ``bias``: other programs still read them)."""
    if not isinstance(out, torch.Tensor):
        return
    for name in ("x", "weight", "bias"):
        t = named.get(name)
        if t is not None and out.numel() and same_view(out, t):
            raise ValueError(f"xkernels.ops.linear: 'out' is input '{name}' {tuple(t.shape)}; the product reads it "
                             f"while the result is written (only the residual may be 'out')")


# -- the kernels' view of the residual ------------------------------------------------------------
class ResidualLayout(NamedTuple):
    """How the kernels read the residual as the (M, N) output's rows: ``kind`` 1 (row ``r`` at
    ``r * s_inner``) or 2 (rows in groups of ``r1``: ``(r // r1) * s_outer + (r % r1) * s_inner``),
    column stride ``s_n``; ``copy``: copied to contiguous rows first; ``wide``: offsets need 64 bits."""

    kind: int
    r1: int
    s_outer: int
    s_inner: int
    s_n: int
    copy: bool
    wide: bool

    def describe(self) -> str:
        if self.copy:
            return "residual copied to contiguous rows first (its leading dims collapse to no two strides)"
        if self.kind == 2:
            return f"residual read in place (rows in groups of {self.r1}: two row strides)"
        return "residual read in place" + (" (broadcast over rows: row stride 0)" if self.s_inner == 0 else "")


def layout(residual: torch.Tensor, out_shape: torch.Size) -> ResidualLayout:
    r = residual.expand(out_shape)
    n = out_shape[-1]
    s_n = r.stride(-1) if n > 1 else 0
    sizes, (strides,) = collapse(tuple(out_shape[:-1]), [tuple(r.stride()[:-1])])
    wide = max_offset(list(out_shape), list(r.stride())) + 2**16 > INT32_MAX
    if len(sizes) == 1:
        return ResidualLayout(1, 1, 0, strides[0] if sizes[0] > 1 else 0, s_n, False, wide)
    if len(sizes) == 2:
        return ResidualLayout(2, sizes[1], strides[0], strides[1], s_n, False, wide)
    m = 1
    for s in out_shape[:-1]:
        m *= s
    return ResidualLayout(1, 1, 0, n, 1, True, m * n + 2**16 > INT32_MAX)


def rows(residual: torch.Tensor, out_shape: torch.Size, lay: ResidualLayout) -> torch.Tensor:
    """The tensor whose data pointer the kernels read (the residual itself, or its contiguous copy)."""
    return residual.expand(out_shape).contiguous() if lay.copy else residual


def args(residual: torch.Tensor, lay: ResidualLayout) -> tuple[Any, ...]:
    """The kernels' residual arguments: (res_ptr, R1, sr0, sr1, srn)."""
    return (residual, lay.r1, lay.s_outer, lay.s_inner, lay.s_n)


# -- the vendor route -------------------------------------------------------------------------------
def vendor_variant(call: MatmulCall, epilogue: str | None) -> str:
    """What the vendor route runs for a call with a residual (``explain()``)."""
    if _addmm(call, epilogue):
        return ("torch.addmm(residual, x, weight.T): the BLAS adds the residual as C (beta=1); with out= the "
                "residual itself (contiguous), residual.addmm_(x, weight.T): one GEMM in place")
    first = (f"torch._addmm_activation ({'bias' if call.bias is not None else 'zero bias'} + {epilogue} in the BLAS "
             "epilogue)" if epilogue else "F.linear + activation")
    if call.result_dtype != call.dtype:
        return f"{first}, then the residual added (promoting the result to {call.result_dtype}: a second pass)"
    return f"{first}, then the residual added in place into that result (a second pass)"


def _addmm(call: MatmulCall, epilogue: str | None) -> bool:
    return (epilogue is None and call.bias is None and call.activation is None
            and call.residual is not None and call.residual.dtype == call.dtype)


def run_vendor(call: MatmulCall, epilogue: str | None) -> torch.Tensor:
    """A vendor-BLAS plan's computation of a call with a residual (see the module doc)."""
    from xkernels.ops.matmul.vendor import epilogue_linear, reference_linear

    a, b, r, out, shape = call.a, call.b, call.residual, call.out, call.out_shape
    assert r is not None
    M, N = a.shape[0], b.shape[1]
    flat = out is not None and out.is_contiguous()
    if _addmm(call, epilogue):
        if flat and same_view(out, r):  # in place: cuBLAS reads and writes the residual
            out.view(M, N).addmm_(a, b)
            return out
        r2 = r.expand(shape).reshape(M, N)  # a view where the residual's rows collapse, else a copy
        if flat:
            torch.addmm(r2, a, b, out=out.view(M, N))
            return out
        y = torch.addmm(r2, a, b)
    else:
        y = (epilogue_linear(a, b, call.bias, epilogue) if epilogue
             else reference_linear(a, b.t(), call.bias, call.activation, call.slope))
        r2 = r.expand(shape).reshape(M, N)
        y = y.add_(r2) if y.dtype == call.result_dtype else y + r2
    y = y.view(shape)
    return y if out is None else out.copy_(y)


def torch_linear(call: MatmulCall) -> torch.Tensor:
    """PyTorch's composition ``act(F.linear(x, w, b)) + residual`` (the fallback and reference)."""
    from xkernels.ops.matmul.vendor import reference_linear

    y = reference_linear(call.a, call.b.t(), call.bias, call.activation, call.slope).reshape(call.out_shape)
    r = call.residual
    return y.add_(r) if r is not None and y.dtype == call.result_dtype else y if r is None else y + r
