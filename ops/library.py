"""The ops as ``torch.library`` custom ops, for ``torch.compile`` and ``torch.export``.

Registered under the ``xkernels`` namespace, each with a real implementation (the op's eager
``call_no_grad``: dispatch, hot entries, kernels), a fake implementation (the op's own ``check``,
so shapes, dtypes and devices are exactly torch's and bad input raises the same error at trace
time; results are contiguous, as the kernels write them) and its autograd (``ops/autograd.py``,
backward GEMMs through ``xkernels::matmul``):

    xkernels::broadcast(Tensor x, Tensor bias) -> Tensor
    xkernels::add(Tensor x, Tensor y, *, Scalar alpha=1) -> Tensor
    xkernels::add.Scalar(Tensor x, Scalar y, *, Scalar alpha=1) -> Tensor        # add(x, 2.0)
    xkernels::add.ScalarTensor(Scalar x, Tensor y, *, Scalar alpha=1) -> Tensor  # add(2.0, y)
    xkernels::matmul(Tensor a, Tensor b) -> Tensor
    xkernels::linear(Tensor x, Tensor weight, Tensor? bias=None, str? activation=None,
                     float negative_slope=0.01, Tensor? residual=None) -> Tensor

Under ``torch.compiler.is_compiling()`` ``xkernels.ops.*`` calls go to these (``Op.__call__``),
so Dynamo puts one opaque node per call in the graph and never traces the dispatch. ``out=`` is
computed functionally and copied into ``out`` (``finish_out``). Which backend runs is decided when
the compiled graph runs (``use_backend`` in effect then), as in eager mode.
"""

from __future__ import annotations

from typing import Any

import torch

from xkernels.ops import autograd as grads

NAMESPACE = "xkernels"
SCHEMAS = {
    "broadcast": "broadcast(Tensor x, Tensor bias) -> Tensor",
    "add": "add(Tensor x, Tensor y, *, Scalar alpha=1) -> Tensor",
    "add.Scalar": "add.Scalar(Tensor x, Scalar y, *, Scalar alpha=1) -> Tensor",
    "add.ScalarTensor": "add.ScalarTensor(Scalar x, Tensor y, *, Scalar alpha=1) -> Tensor",
    "matmul": "matmul(Tensor a, Tensor b) -> Tensor",
    "linear": "linear(Tensor x, Tensor weight, Tensor? bias=None, str? activation=None, "
              "float negative_slope=0.01, Tensor? residual=None) -> Tensor",
}
_lib: Any = None
_registered: dict[str, Any] = {}  # op name -> the Op object, handed in by ``register``


def _ops() -> dict[str, Any]:
    return _registered


# -- real and fake implementations --------------------------------------------------------------
def _broadcast(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _ops()["broadcast"].call_no_grad(x, bias)


def _add(x: Any, y: Any, *, alpha: Any = 1) -> torch.Tensor:
    return _ops()["add"].call_no_grad(x, y, alpha=alpha)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _ops()["matmul"].call_no_grad(a, b)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
            negative_slope: float = 0.01, residual: torch.Tensor | None = None) -> torch.Tensor:
    if residual is None:
        return _ops()["linear"].call_no_grad(x, weight, bias, activation, negative_slope=negative_slope)
    return _ops()["linear"].call_no_grad(x, weight, bias, activation, negative_slope=negative_slope,
                                         residual=residual)


def _empty(shape: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def _broadcast_fake(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    call = _ops()["broadcast"].check(x, bias)
    return _empty(call.shape, call.dtype, call.device)


def _add_fake(x: Any, y: Any, *, alpha: Any = 1) -> torch.Tensor:
    call = _ops()["add"].check(x, y, alpha=alpha)
    return _empty(call.shape, call.dtype, call.device)


def _matmul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    call = _ops()["matmul"].check(a, b)
    return _empty(call.out_shape, call.dtype, call.device)


def _linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 activation: str | None = None, negative_slope: float = 0.01,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
    call = _ops()["linear"].check(x, weight, bias, activation, negative_slope=negative_slope, residual=residual)
    return _empty(call.out_shape, call.result_dtype, call.device)


# -- autograd -----------------------------------------------------------------------------------
def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ops.xkernels.matmul.default(a, b)


def _lin(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.xkernels.linear.default(x, w, bias)


def _binary_setup(ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any) -> None:
    x, y = inputs[0], inputs[1]
    ctx.operands = tuple(grads._Operand(v) if isinstance(v, torch.Tensor) else v for v in (x, y))
    ctx.alpha = keyword_only_inputs.get("alpha", 1)


def _broadcast_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _binary_setup(ctx, inputs, {}, output)


def _binary_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, y = ctx.operands
    n = grads.input_needs(ctx, 2)
    gx, gy = grads.binary_backward(grad, x, y, ctx.alpha, (n[0], n[1]))
    return gx, gy


def _matmul_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])


def _matmul_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    a, b = ctx.saved_tensors
    n = grads.input_needs(ctx, 2)
    return grads.matmul_backward(grad, a, b, (n[0], n[1]), _mm)


def _linear_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, bias, activation, slope, residual = inputs
    keep_y = grads.keeps_output(activation, slope, residual)
    ctx.save_for_backward(x, weight, bias, output if keep_y else None)
    ctx.activation, ctx.slope = activation, float(slope)
    ctx.residual = None if residual is None else grads._Operand(residual)


def _linear_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight, bias, y = ctx.saved_tensors
    n = grads.input_needs(ctx, 6)
    gx, gw, gb = grads.linear_backward(grad, x, weight, bias, ctx.activation, ctx.slope, y, (n[0], n[1], n[2]),
                                       _mm, _lin)
    r = ctx.residual
    gr = grads._to_operand(grad, r.shape, r.dtype, r.device) if r is not None and n[5] else None
    return gx, gw, gb, None, None, gr


def register(ops: dict[str, Any]) -> None:
    """Define the custom ops (once; later calls do nothing). ``ops``: op name -> the Op object
    whose ``call_no_grad`` and ``check`` the real and fake implementations call (the ops package
    hands them in: this module sits below the ops and imports none of them)."""
    global _lib
    _registered.update(ops)
    if _lib is not None or not hasattr(torch.library, "register_autograd"):  # torch < 2.4: eager only
        return
    lib = torch.library.Library(NAMESPACE, "DEF")
    impls = {"broadcast": (_broadcast, _broadcast_fake), "add": (_add, _add_fake), "add.Scalar": (_add, _add_fake),
             "add.ScalarTensor": (_add, _add_fake), "matmul": (_matmul, _matmul_fake),
             "linear": (_linear, _linear_fake)}
    for name, schema in SCHEMAS.items():
        lib.define(schema)
        real, fake = impls[name]
        lib.impl(name, real, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
    torch.library.register_autograd(f"{NAMESPACE}::broadcast", _binary_backward, setup_context=_broadcast_setup,
                                    lib=lib)
    for name in ("add", "add.Scalar", "add.ScalarTensor"):
        torch.library.register_autograd(f"{NAMESPACE}::{name}", _binary_backward, setup_context=_binary_setup, lib=lib)
    torch.library.register_autograd(f"{NAMESPACE}::matmul", _matmul_backward, setup_context=_matmul_setup, lib=lib)
    torch.library.register_autograd(f"{NAMESPACE}::linear", _linear_backward, setup_context=_linear_setup, lib=lib)
    _lib = lib


# -- the calls Op.__call__ makes while compiling ------------------------------------------------
def finish_out(op: str, result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``out=`` in a compiled call: the functional result copied into ``out``."""
    if _lib is None:
        raise RuntimeError(f"xkernels.ops.{op}: torch.compile/torch.export of xkernels ops needs torch >= 2.4 "
                           f"(torch.library.register_autograd); this is torch {torch.__version__}")
    if out is None:
        return result
    if out.shape != result.shape:
        raise ValueError(f"xkernels.ops.{op}: 'out' has shape {tuple(out.shape)}, the result has shape "
                         f"{tuple(result.shape)}")
    if out.dtype != result.dtype:
        raise TypeError(f"xkernels.ops.{op}: 'out' has dtype {out.dtype}, the result has dtype {result.dtype}")
    return out.copy_(result)


def add(x: Any, y: Any, alpha: Any) -> torch.Tensor:
    """``xkernels::add`` with the overload for where the Python number is."""
    if isinstance(x, torch.Tensor):
        if isinstance(y, torch.Tensor):
            return torch.ops.xkernels.add.default(x, y, alpha=alpha)
        return torch.ops.xkernels.add.Scalar(x, y, alpha=alpha)
    return torch.ops.xkernels.add.ScalarTensor(x, y, alpha=alpha)
