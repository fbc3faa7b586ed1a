"""Gradients of ``add_layer_norm`` / ``add_rms_norm`` and their ``torch.library`` custom ops.

Backward: from the saved sum ``s`` and the forward's per-row statistics (``mean``, ``rstd``, fp32,
written by the forward kernel; recomputed from ``s`` where a route did not produce them), in fp32
(float64 for float64 inputs)::

    xhat = (s - mean) * rstd                 (RMSNorm: s * rstd)
    g    = dy * w                            (RMSNorm: dy * (offset + w); no weight: dy)
    d(s) = rstd * (g - mean(g) - xhat * mean(g * xhat)) + ds     (RMSNorm: no mean(g) term)
    d(w) = sum over rows of dy * xhat,  d(b) = sum over rows of dy

``ds`` is the gradient reaching the returned sum (the next block's residual), so
``d(x) = d(s)`` and ``d(residual) = d(s)`` summed over the dims the residual was broadcast
along, each cast to its operand's dtype. Double backward is not supported (``once_differentiable``).

Two routes (:func:`grads`): the fused Triton kernel (``add_norm_bwd.py``: one pass over s, dy, ds
writing d(x) once) where the forward's backend runs Triton and every dtype is a kernel dtype,
unless the table rule says ``"backward": "torch"``; else PyTorch (:func:`norm_backward`, ~15 fp32
passes): float64, the cpu backend, a forward without statistics (a plugin's), no ``dy``. The
backend is the forward's (saved at forward time: autograd runs a cuda backward in its own thread,
where ``use_backend`` of the caller does not reach). While ``torch.compile`` traces the custom
op's backward it is always the PyTorch formula (traceable ops; the kernel takes real tensors).

Custom ops (for ``torch.compile(fullgraph=True)`` and ``torch.export``)::

    xkernels::add_layer_norm(Tensor x, Tensor? residual, Tensor? weight=None, Tensor? bias=None,
                             float eps=1e-05, bool return_sum=True) -> (Tensor, Tensor, Tensor, Tensor)
    xkernels::add_rms_norm(Tensor x, Tensor? residual, Tensor? weight=None, float eps=1e-06,
                           float offset=0.0, bool return_sum=True) -> (Tensor, Tensor, Tensor, Tensor)

returning ``(y, s, mean, rstd)``: ``s`` is an empty ``(0,)`` tensor when ``return_sum`` is False
(never written; the backward recomputes it from x and residual), ``mean`` is ``(0,)`` for
RMSNorm; the front door returns ``(y, s)`` or ``y``. Fake implementations run the op's own
checks, so bad input raises the same error while tracing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from xkernels import dispatch
from xkernels.ops.autograd import input_needs, owned
from xkernels.ops.fused import add_norm_bwd as bwd
from xkernels.ops.layout import prod

_lib: Any = None
SCHEMAS = {
    "add_layer_norm": "add_layer_norm(Tensor x, Tensor? residual, Tensor? weight=None, Tensor? bias=None, "
                      "float eps=1e-05, bool return_sum=True) -> (Tensor, Tensor, Tensor, Tensor)",
    "add_rms_norm": "add_rms_norm(Tensor x, Tensor? residual, Tensor? weight=None, float eps=1e-06, "
                    "float offset=0.0, bool return_sum=True) -> (Tensor, Tensor, Tensor, Tensor)",
}


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


_functional = getattr(torch, "_is_functional_tensor", None) or getattr(torch._C, "_is_functional_tensor", None)
_is_fake: Any = None  # torch._subclasses.fake_tensor.is_fake, imported on the first backward (False: no such torch)


def _traced(t: torch.Tensor) -> bool:
    """Whether ``t`` is being traced (Dynamo, or AOT autograd's fake/functional tensors while it
    traces a backward): a kernel needs real data pointers, the PyTorch formula traces."""
    global _is_fake
    if torch.compiler.is_compiling() or (_functional is not None and _functional(t)):
        return True
    if _is_fake is None:
        try:
            from torch._subclasses.fake_tensor import is_fake
        except ImportError:  # pragma: no cover - older torch
            is_fake = False
        _is_fake = is_fake
    return _is_fake is not False and _is_fake(t)


def recompute_sum(x: torch.Tensor, residual: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    s = x if residual is None else x + residual
    return s if s.dtype == dtype else s.to(dtype)


def statistics(s: torch.Tensor, kind: str, eps: float) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(mean or None for RMSNorm, rstd) of ``s`` per row, in the compute dtype."""
    rows = s.reshape(-1, s.shape[-1]).to(_wide(s.dtype))
    if kind == "rms":
        return None, torch.rsqrt(rows.square().mean(1) + eps)
    var, mean = torch.var_mean(rows, dim=1, correction=0)
    return mean, torch.rsqrt(var + eps)


def norm_backward(kind: str, dy: torch.Tensor | None, ds: torch.Tensor | None, s: torch.Tensor,
                  mean: torch.Tensor | None, rstd: torch.Tensor | None, weight: torch.Tensor | None,
                  has_bias: bool, eps: float, offset: float,
                  needs_wb: tuple[bool, bool]) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(d(s) as (rows, N) in the compute dtype, d(weight), d(bias)); see the module doc."""
    n = s.shape[-1]
    wide = _wide(s.dtype)
    rows = s.numel() // n if n else 0
    if rstd is None or rstd.numel() != rows or (kind == "layer" and (mean is None or mean.numel() != rows)):
        mean, rstd = statistics(s, kind, eps)
    sf = s.reshape(-1, n).to(wide)
    r = rstd.to(wide)[:, None]
    xhat = (sf - mean.to(wide)[:, None]) * r if kind == "layer" else sf * r
    gs = gw = gb = None
    if dy is not None:
        g = dy.reshape(-1, n).to(wide)
        if weight is not None and needs_wb[0]:
            gw = (g * xhat).sum(0).to(weight.dtype)
        if has_bias and needs_wb[1]:
            gb = g.sum(0)
        if weight is not None:
            g = g * (weight.to(wide) + offset) if offset else g * weight.to(wide)
        proj = (g * xhat).mean(1, keepdim=True)
        gs = r * (g - g.mean(1, keepdim=True) - xhat * proj) if kind == "layer" else r * (g - xhat * proj)
    if ds is not None:
        d = ds.reshape(-1, n).to(wide)
        gs = d if gs is None else gs + d
    return gs, gw, gb


def operand_grads(gs: torch.Tensor | None, shape: torch.Size, x_dtype: torch.dtype,
                  residual: tuple[torch.Size, torch.dtype] | None,
                  needs: tuple[bool, bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if gs is None:
        return None, None
    g = gs.reshape(shape)
    gx = g.to(x_dtype) if needs[0] else None
    gr = None
    if residual is not None and needs[1]:
        gr = (g.sum_to_size(residual[0]) if residual[0] != shape else g).to(residual[1])
    return gx, gr


def grads(backend: Any, kind: str, eps: float, offset: float, dy: torch.Tensor | None, ds: torch.Tensor | None,
          s: torch.Tensor | None, x: torch.Tensor | None, residual: torch.Tensor | None, mean: torch.Tensor | None,
          rstd: torch.Tensor | None, weight: torch.Tensor | None, b_dtype: torch.dtype | None, shape: torch.Size,
          s_dtype: torch.dtype, x_dtype: torch.dtype, res: tuple[torch.Size, torch.dtype] | None,
          needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, ...]:
    """(d(x), d(residual), d(weight), d(bias)), each ``None`` where not required (``needs``), by
    the kernel or PyTorch (module doc). ``s``: the saved sum, or ``None`` (then ``x`` and
    ``residual`` are given and the sum is recomputed)."""
    rows = prod(shape[:-1])
    stats_ok = (rstd is not None and rstd.numel() == rows and rstd.dtype == torch.float32
                and (kind == "rms" or (mean is not None and mean.numel() == rows)))
    if dy is not None and stats_ok and not _traced(dy) and bwd.route(
            backend, dy.device, kind, s_dtype, shape,
            (x_dtype, None if res is None else res[1], None if weight is None else weight.dtype, b_dtype, dy.dtype,
             None if ds is None else ds.dtype)) == "kernel":
        return bwd.backward(backend, kind, offset, dy, ds, s, x, residual, mean if kind == "layer" else None, rstd,
                            weight, b_dtype, shape, s_dtype, x_dtype, res, tuple(needs))
    if s is None:
        s = recompute_sum(x, residual, s_dtype)
    gs, gw, gb = norm_backward(kind, dy, ds, s, mean if kind == "layer" else None, rstd, weight, b_dtype is not None,
                               eps, offset, (needs[2], kind == "layer" and needs[3]))
    gx, gr = operand_grads(gs, shape, x_dtype, res, (needs[0], needs[1]))
    return gx, gr, gw, None if gb is None else gb.to(b_dtype)


# -- eager autograd -----------------------------------------------------------------------------
class AddNormFunction(torch.autograd.Function):
    """A forward recorded by autograd: ``forward()`` returns (y, s, mean, rstd) with s always
    written (the backward needs it); ``meta`` = (kind, eps, offset, x's shape, x's dtype,
    (residual's shape, dtype) or None, bias dtype or None, the backend the forward ran on, and
    from a signature's route its ``add_norm_bwd.HotBackward``, which launches the backward's
    repeats). The full path (``recorded``) and a signature's route (``add_norm_route``) both
    record it."""

    @staticmethod
    def forward(ctx: Any, forward: Any, meta: tuple[Any, ...], x: torch.Tensor, residual: torch.Tensor | None,
                weight: torch.Tensor | None, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        y, s, mean, rstd = forward()
        y, s = owned(y, x, residual, weight, bias), owned(s, x, residual, weight, bias)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(s, mean, rstd, weight)
        ctx.meta = meta
        return y, s

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor | None, ds: torch.Tensor | None) -> tuple[Any, ...]:
        s, mean, rstd, weight = ctx.saved_tensors
        return None, None, *saved_grads(ctx.meta, dy, ds, s, mean, rstd, weight, ctx.needs_input_grad[2:6])


def saved_grads(meta: tuple[Any, ...], dy: torch.Tensor | None, ds: torch.Tensor | None, s: torch.Tensor,
                mean: torch.Tensor | None, rstd: torch.Tensor | None, weight: torch.Tensor | None,
                needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, ...]:
    """(d(x), d(residual), d(weight), d(bias)) of a recorded forward (``AddNormFunction``'s
    ``meta`` and saved tensors; also the native grad_fn's fallback, ``add_norm_native``)."""
    kind, eps, offset, shape, x_dtype, res, b_dtype, backend, *hot = meta
    if hot and dy is not None and rstd is not None and (kind == "rms" or mean is not None) and not _traced(dy):
        out = hot[0](offset, dy, ds, s, mean, rstd, weight, needs)  # a route's repeats (bwd.HotBackward)
        if out is not None:
            return out
    return grads(backend, kind, eps, offset, dy, ds, s, None, None, mean, rstd, weight, b_dtype,
                 shape, s.dtype, x_dtype, res, needs)


def recorded(op: Any, call: Any) -> Any:
    """The checked ``call`` of ``op`` recorded by autograd (the full path's forward)."""
    call.store_sum = True
    x, residual, bias = call.x, call.residual, call.bias
    meta = (call.kind, call.eps, call.offset, x.shape, x.dtype,
            None if residual is None else (residual.shape, residual.dtype), None if bias is None else bias.dtype,
            dispatch.select(call.device))
    y, s = AddNormFunction.apply(lambda: op.forward_all(call), meta, x, residual, call.weight, bias)
    return (y, s) if call.return_sum else y


# -- custom ops ---------------------------------------------------------------------------------
_registered: dict[str, Any] = {}  # "add_layer_norm" / "add_rms_norm" -> the Op, handed in by ``register``


def _ops() -> dict[str, Any]:
    return _registered


def _outputs(call: Any, y: torch.Tensor, s: torch.Tensor | None, mean: torch.Tensor | None,
             rstd: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    if rstd is None:  # a route without statistics (a plugin's): from s, or x + residual
        base = s if s is not None else recompute_sum(call.x, call.residual, call.dtype)
        mean, rstd = statistics(base, call.kind, call.eps)
        rstd = rstd.float() if call.dtype != torch.float64 else rstd
        mean = None if mean is None else mean.to(rstd.dtype)
    empty = torch.empty(0, dtype=call.dtype, device=call.device)
    return (y, s if s is not None else empty, mean if mean is not None else rstd.new_empty(0), rstd)


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _fake_outputs(call: Any) -> tuple[torch.Tensor, ...]:
    dev, dt, rows = call.device, call.dtype, call.rows
    st = _stats_dtype(dt)
    return (torch.empty(call.shape, dtype=dt, device=dev),
            torch.empty(call.shape if call.return_sum else (0,), dtype=dt, device=dev),
            torch.empty(rows if call.kind == "layer" else 0, dtype=st, device=dev),
            torch.empty(rows, dtype=st, device=dev))


def _layer(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, eps: float = 1e-5, return_sum: bool = True) -> tuple[torch.Tensor, ...]:
    op = _ops()["add_layer_norm"]
    call = op.check(x, residual, weight, bias, eps, return_sum=return_sum)
    return _outputs(call, *op.forward_all(call))


def _layer_fake(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, eps: float = 1e-5, return_sum: bool = True) -> tuple[torch.Tensor, ...]:
    return _fake_outputs(_ops()["add_layer_norm"].check(x, residual, weight, bias, eps, return_sum=return_sum))


def _rms(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None = None, eps: float = 1e-6,
         offset: float = 0.0, return_sum: bool = True) -> tuple[torch.Tensor, ...]:
    op = _ops()["add_rms_norm"]
    call = op.check(x, residual, weight, eps, offset=offset, return_sum=return_sum)
    return _outputs(call, *op.forward_all(call))


def _rms_fake(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None = None, eps: float = 1e-6,
              offset: float = 0.0, return_sum: bool = True) -> tuple[torch.Tensor, ...]:
    return _fake_outputs(_ops()["add_rms_norm"].check(x, residual, weight, eps, offset=offset, return_sum=return_sum))


def _setup(kind: str) -> Any:
    def setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        if kind == "layer":
            x, residual, weight, bias, eps, return_sum = inputs
            offset = 0.0
        else:
            x, residual, weight, eps, offset, return_sum = inputs
            bias = None
        y, s, mean, rstd = output
        keep = (s, None, None) if return_sum else (None, x, residual)
        ctx.save_for_backward(*keep, mean, rstd, weight)
        ctx.meta = (kind, eps, offset, bias is not None, x.shape, x.dtype,
                    None if residual is None else (residual.shape, residual.dtype),
                    None if bias is None else bias.dtype, y.dtype, dispatch.select(x.device))
    return setup


def _backward(ctx: Any, dy: Any, ds: Any, _gmean: Any = None, _grstd: Any = None) -> tuple[Any, ...]:
    s, x, residual, mean, rstd, weight = ctx.saved_tensors
    kind, eps, offset, _, shape, x_dtype, res, b_dtype, dtype, backend = ctx.meta
    if s is None or (ds is not None and ds.numel() == 0):
        ds = None  # return_sum=False: s was not returned, nothing reaches it
    needs = input_needs(ctx, 4)
    gx, gr, gw, gb = grads(backend, kind, eps, offset, dy, ds, s, x, residual, mean, rstd, weight,
                           b_dtype if kind == "layer" else None, shape, dtype, x_dtype, res,
                           (needs[0], needs[1], needs[2], kind == "layer" and needs[3]))
    if kind == "layer":
        return gx, gr, gw, gb, None, None
    return gx, gr, gw, None, None, None


def register(ops: dict[str, Any]) -> None:
    """Define the two custom ops (once; torch < 2.4 has no register_autograd: eager only).
    ``ops``: the two Op objects (handed in by the ops package: this module sits below them)."""
    global _lib
    _registered.update(ops)
    if _lib is not None or not hasattr(torch.library, "register_autograd"):
        return
    lib = torch.library.Library("xkernels", "FRAGMENT")
    for name, (real, fake, kind) in {"add_layer_norm": (_layer, _layer_fake, "layer"),
                                     "add_rms_norm": (_rms, _rms_fake, "rms")}.items():
        lib.define(SCHEMAS[name])
        lib.impl(name, real, "CompositeExplicitAutograd")
        torch.library.register_fake(f"xkernels::{name}", fake, lib=lib)
        torch.library.register_autograd(f"xkernels::{name}", _backward, setup_context=_setup(kind), lib=lib)
    _lib = lib


def compiled(op: Any, canon: tuple[Any, ...]) -> Any:
    """The call as its custom op, while ``torch.compile``/``torch.export`` trace."""
    if _lib is None:
        raise RuntimeError(f"xkernels.ops.{op.name}: torch.compile/torch.export of xkernels ops needs torch >= 2.4 "
                           f"(torch.library.register_autograd); this is torch {torch.__version__}")
    return op.library_call(canon)
