"""``gated_linear(x, weight, up_weight=None, bias=None, up_bias=None, activation="silu")``: the part
of a gated MLP (Llama/Mistral/Qwen2 SwiGLU, Gemma/T5 v1.1 GeGLU, Phi-3) before its down
projection, ``act(x @ Wg.T + bg) * (x @ Wu.T + bu)``, as one op.

* ``up_weight`` given: ``weight`` is the gate projection's (I, H), ``up_weight`` the up
  projection's (I, H); ``bias`` / ``up_bias`` are theirs, (I,) each.
* ``up_weight`` None: ``weight`` is Phi-3's concatenated (2*I, H) gate_up weight, gate rows
  first (``gate, up = gate_up_proj(x).chunk(2, dim=-1)``); ``bias`` then has 2*I entries likewise
  and ``up_bias`` must be None.
* Result ``(*x.shape[:-1], I)``; ``activation`` one of relu | gelu (erf) | gelu_tanh | silu |
  quick_gelu | relu2 (squared ReLU, BitNet's).

float16, bfloat16 and float32 run a Triton route (``gated_linear_plan.py``: the fused kernel or
the device's BLAS followed by a gate kernel; fp32 follows torch's TF32 setting, as ``linear``);
float64 is computed by PyTorch; other dtypes are a TypeError. Bad input raises before any kernel
runs, naming the argument and the shapes, dtypes or devices. A repeated call with the same
signature (each tensor's shape, strides, dtype and device, the activation) takes the route the
first one left (``gated_linear_hot.py``): no check, no planning, allocation and launch only.

Autograd (every backend): gradients for x, weight, up_weight, bias and up_bias. Eagerly the
forward keeps gate and up as PyTorch's own composition does (the fused kernel writes them beside
the output; the vendor route has them anyway), so the backward recomputes nothing: d_gate = dy *
up * act'(gate) (aten's ``silu_backward`` / ``gelu_backward`` / ``threshold_backward``), d_up =
dy * act(gate), then the GEMMs through ``xkernels.ops.matmul`` (one each for x and weight with a
concatenated weight, two with separate ones). Under ``torch.compile`` the custom op
``xkernels::gated_linear`` is one node whose backward recomputes gate and up with
``xkernels::linear`` (a custom op's autograd keeps only inputs and outputs), as ``linear``'s does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.ops import checks
from xkernels.ops.autograd import activation_grad, input_needs, owned
from xkernels.ops.fused import gated_linear_hot
from xkernels.ops.fused.gated_linear_plan import GatedPlan, gate_grads
from xkernels.ops.matmul.vendor import activate
from xkernels.ops.op import Op, Param, Plan
from xkernels.ops.route import Route
from xkernels.registry import registry

__all__ = ["ACTIVATIONS", "GatedCall", "GatedLinear", "gated_linear", "reference_gated_linear"]

#: relu2 is BitNet's (``relu(gate)**2 * up``); quick_gelu ``g * sigmoid(1.702 g)`` as CLIP's
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "quick_gelu", "relu2")
_NAME = "xkernels.ops.gated_linear"


@dataclass
class GatedCall:
    x2: torch.Tensor  # (M, K): x with its leading dims folded
    weight: torch.Tensor  # as given: (I, K), or the concatenated (2I, K)
    bias: torch.Tensor | None  # as given
    wg: torch.Tensor  # (I, K) gate rows (a view of the concatenated weight)
    wu: torch.Tensor  # (I, K) up rows
    bg: torch.Tensor | None
    bu: torch.Tensor | None
    activation: str
    concatenated: bool
    out_shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    kernel_ok: bool
    fallback_reason: str = ""
    save: bool = False  # keep gate and up for the backward

    @property
    def empty(self) -> bool:
        return self.x2.shape[0] == 0 or self.wg.shape[0] == 0


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _tensor_arg(name: str, v: Any, dims: int | None = None) -> torch.Tensor:
    checks.require_tensor("gated_linear", name, v)
    if dims is not None and v.dim() != dims:
        raise ValueError(f"{_NAME}: '{name}' must be {dims}-D, got shape {_shape(v)}")
    return v


class GatedLinear(Op):
    """``act(x @ weight.T + bias) * (x @ up_weight.T + up_bias)``; see the module doc."""

    name = "gated_linear"
    # cast under torch.autocast, as PyTorch casts its GEMMs (ops/autocast.py)
    autocast_params = ("x", "weight", "up_weight", "bias", "up_bias")
    records_leave_routes = False  # a training call plans the kernel that also saves gate and up
    params = (Param("x"), Param("weight"), Param("up_weight", None), Param("bias", None), Param("up_bias", None),
              Param("activation", "silu", key="value"))

    def check(self, x: Any, weight: Any, up_weight: Any = None, bias: Any = None, up_bias: Any = None,
              activation: Any = "silu") -> GatedCall:
        _tensor_arg("x", x)
        _tensor_arg("weight", weight, 2)
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise ValueError(f"{_NAME}: 'activation' must be one of {list(ACTIVATIONS)}, got {activation!r}")
        if x.dim() == 0:
            raise ValueError(f"{_NAME}: 'x' must have at least 1 dimension (..., H), got a 0-d tensor")
        named = {"x": x, "weight": weight}
        concatenated = up_weight is None
        if concatenated:
            if weight.shape[0] % 2:
                raise ValueError(f"{_NAME}: without 'up_weight', 'weight' is the concatenated (2*I, H) gate_up "
                                 f"weight, so its rows must be even; got shape {_shape(weight)}")
            if up_bias is not None:
                raise ValueError(f"{_NAME}: 'up_bias' needs 'up_weight'; with the concatenated 'weight' "
                                 f"{_shape(weight)}, 'bias' holds both halves ({weight.shape[0]} entries)")
            inter = weight.shape[0] // 2
        else:
            _tensor_arg("up_weight", up_weight, 2)
            if up_weight.shape != weight.shape:
                raise ValueError(f"{_NAME}: 'weight' and 'up_weight' must have one shape (I, H), got "
                                 f"{_shape(weight)} and {_shape(up_weight)}")
            named["up_weight"] = up_weight
            inter = weight.shape[0]
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(f"{_NAME}: 'x' {_shape(x)} has {x.shape[-1]} features, 'weight' {_shape(weight)} "
                             f"expects {weight.shape[1]}")
        for name, b, want in (("bias", bias, 2 * inter if concatenated else inter), ("up_bias", up_bias, inter)):
            if b is None:
                continue
            _tensor_arg(name, b)
            if _shape(b) != (want,):
                whose = "the concatenated 'weight' (gate entries, then up)" if concatenated and name == "bias" else (
                    "'weight'" if name == "bias" else "'up_weight'")
                raise ValueError(f"{_NAME}: '{name}' must have shape ({want},) for {whose} {_shape(weight)}, "
                                 f"got {_shape(b)}")
            named[name] = b
        if any(t.dtype != x.dtype for t in named.values()):
            listing = ", ".join(f"'{n}' {t.dtype}" for n, t in named.items())
            raise TypeError(f"{_NAME}: tensors must have one dtype, got {listing}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"{_NAME}: dtype {x.dtype} is not supported; use a floating-point dtype")
        if any(t.device != x.device for t in named.values()):
            listing = ", ".join(f"'{n}' on {t.device}" for n, t in named.items())
            raise ValueError(f"{_NAME}: tensors must be on one device, got {listing}")
        x2 = x if x.dim() == 2 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not -1: H may be 0
        if concatenated:
            wg, wu = weight[:inter], weight[inter:]
            bg, bu = (None, None) if bias is None else (bias[:inter], bias[inter:])
        else:
            wg, wu, bg, bu = weight, up_weight, bias, up_bias
        reason = "" if x.dtype in checks.MATMUL_KERNEL_DTYPES else (
            f"dtype {x.dtype} has no Triton gated_linear kernel; PyTorch computes it")
        return GatedCall(x2, weight, bias, wg, wu, bg, bu, activation, concatenated,
                         torch.Size((*x.shape[:-1], inter)), x.dtype, x.device, not reason, reason)

    # -- routing ------------------------------------------------------------------------------
    def explain(self, *args: Any, **kwargs: Any) -> Any:
        """``Op.explain``, plus how a call needing a gradient runs (``GatedLinearFunction``)."""
        exp = super().explain(*args, **kwargs)
        if exp.route not in ("triton kernel", "vendor BLAS + gate kernel"):
            return exp
        keeps = ("the fused kernel also writes gate and up" if exp.route == "triton kernel"
                 else "the BLAS's gate and up results are kept")
        return dataclasses.replace(exp, training=f"{keeps}; the backward reads them in one element-wise kernel "
                                                 "(gate_grad_kernel: d(gate), d(up)), then the GEMMs")

    def plan_key(self, call: GatedCall, backend: Backend) -> Any:
        return (backend.name, call.device, call.dtype, call.activation, call.concatenated, call.save,
                *((_shape(t), t.stride()) for t in (call.x2, call.wg, call.wu)),
                call.bg is not None and call.bg.stride(), call.bu is not None and call.bu.stride(),
                call.bg is None, call.bu is None, precision_key(backend, call.dtype))

    def plan(self, call: GatedCall, backend: Backend) -> Plan:
        """As ``Op.plan`` without autotune on first use (``xkernels.autotune`` knows the buckets
        and candidates of matmul/linear/add/broadcast only)."""
        key = self.plan_key(call, backend)
        forced = tuning.forced_key()
        if forced is not None:
            key = (key, forced)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.make_plan(call, backend)
            if len(self._plans) > self.plan_cache_size:
                self._plans.popitem(last=False)
        return plan

    def make_plan(self, call: GatedCall, backend: Backend) -> Plan:
        return GatedPlan(backend, call)

    def run_plan(self, plan: Plan, call: GatedCall) -> torch.Tensor:
        assert isinstance(plan, GatedPlan)
        if call.empty:
            return self.torch_impl(call)
        return plan.run(call)[0].view(call.out_shape)

    def torch_impl(self, call: GatedCall) -> torch.Tensor:
        return torch_parts(call)[0].reshape(call.out_shape)

    def compile_cases(self, target: Any) -> Any:
        """The npu compilations of ``gated_linear.json``'s entries (``ops/fused/gated_linear_compile.py``)."""
        from xkernels.ops.fused.gated_linear_compile import gated_cases

        return gated_cases(self, target)

    def compile_classes(self) -> list[dict[str, Any]]:
        """The classes of this op's calls as table conditions (dtype, activation, bias, weight
        form): the compile check walks the tuning rules once per class; an activation added to
        ``ACTIVATIONS`` is compiled with no edit elsewhere."""
        from xkernels.ops.fused.gated_linear_compile import gated_classes

        return gated_classes(ACTIVATIONS)

    def make_hot(self, plan: Plan, call: GatedCall, canon: tuple[Any, ...]) -> Route | None:
        """The route of the call's signature (``gated_linear_hot.py``): a ``VendorRoute`` for the
        BLAS + gate kernel plan (``autograd_run``: the PyTorch composition), a ``KernelRoute``
        for the fused kernel; ``None`` for an empty result."""
        assert isinstance(plan, GatedPlan)
        return gated_linear_hot.make_hot(plan, call, canon, GatedLinearFunction)

    # -- autograd and torch.compile -----------------------------------------------------------
    def autograd(self, canon: tuple[Any, ...], route: Route | None = None) -> torch.Tensor:
        call = self.check(*canon)  # before autograd records anything
        return GatedLinearFunction.apply(lambda: self._forward_saving(call, canon), *canon)

    def _forward_saving(self, call: GatedCall, canon: tuple[Any, ...]) -> tuple[torch.Tensor, Any, Any, Any]:
        """(y, gate, up, backend) of a call whose backward will need gate and up (``None`` for both
        where a plugin's implementation computed y: the backward then recomputes them); ``backend``
        the one whose kernels ran (the backward's element-wise kernel runs there), else ``None``."""
        backend = self._backend(call)
        impl = registry.op_impl(self.name, backend.name)
        if impl is not None:
            return impl.fn(*canon), None, None, None
        if not backend.runs_triton or not call.kernel_ok or call.empty:
            y, g, u = torch_parts(call)
            return y.reshape(call.out_shape), g, u, None
        call.save = True
        plan = self.plan(call, backend)
        assert isinstance(plan, GatedPlan)
        y, g, u = plan.run(call)
        return y.view(call.out_shape), g, u, backend

    def _compiled(self, canon: tuple[Any, ...]) -> torch.Tensor:
        if _lib is None:
            raise RuntimeError(f"{_NAME}: torch.compile/torch.export of xkernels ops needs torch >= 2.4 "
                               f"(torch.library.register_autograd); this is torch {torch.__version__}")
        return torch.ops.xkernels.gated_linear.default(*canon)

    def library_call(self, canon: tuple[Any, ...]) -> torch.Tensor:
        return torch.ops.xkernels.gated_linear.default(*canon)


def precision_key(backend: Backend, dtype: torch.dtype) -> str:
    from xkernels.ops.matmul.plan import precision

    return precision(backend, dtype)


def torch_parts(call: GatedCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y (M, I), gate, up) computed by PyTorch (the concatenated weight in one GEMM)."""
    F = torch.nn.functional
    if call.concatenated:
        g, u = F.linear(call.x2, call.weight, call.bias).chunk(2, dim=-1)
    else:
        g, u = F.linear(call.x2, call.wg, call.bg), F.linear(call.x2, call.wu, call.bu)
    return activate(g, call.activation) * u, g, u


def reference_gated_linear(x: torch.Tensor, weight: torch.Tensor, up_weight: torch.Tensor | None = None,
                           bias: torch.Tensor | None = None, up_bias: torch.Tensor | None = None,
                           activation: str = "silu") -> torch.Tensor:
    """The PyTorch composition ``gated_linear`` is defined by (and benchmarked against)."""
    F = torch.nn.functional
    if up_weight is None:
        gate, up = F.linear(x, weight, bias).chunk(2, dim=-1)
    else:
        gate, up = F.linear(x, weight, bias), F.linear(x, up_weight, up_bias)
    return activate(gate, activation) * up


# -- gradients ------------------------------------------------------------------------------------
def gated_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, up_weight: torch.Tensor | None,
                   bias: torch.Tensor | None, up_bias: torch.Tensor | None, activation: str,
                   gate: torch.Tensor | None, up: torch.Tensor | None, needs: tuple[bool, ...],
                   mm: Any, lin: Any, backend: Any = None) -> tuple[torch.Tensor | None, ...]:
    """Gradients for (x, weight, up_weight, bias, up_bias). ``gate``/``up`` (M, I) as the forward
    kept them, or ``None``: recomputed with ``lin`` (a GEMM each; one for a concatenated weight).
    ``backend``: where the forward's kernels ran; d(gate) and d(up) then come from one
    ``gate_grad_kernel`` launch there (``gated_linear_plan.gate_grads``), else from PyTorch's ops."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if gate is None or up is None:
        if up_weight is None:
            gate, up = lin(x2, weight, bias).chunk(2, dim=-1)
        else:
            gate, up = lin(x2, weight, bias), lin(x2, up_weight, up_bias)
    n = gate.shape[-1]
    dy2 = dy.reshape(-1, n)
    fused = None if backend is None else gate_grads(backend, dy2, gate, up, activation, up_weight is None)
    if fused is not None:
        d_gate, d_up, d = fused
    else:
        d_up = dy2 * activate(gate, activation)
        # the pre-activation itself (relu reads gate > 0 off it, as off act(gate); relu2 must not read it as an output)
        d_gate = activation_grad(dy2 * up, activation, 0.0, gate if activation == "relu" else None, lambda: gate)
        d = torch.cat([d_gate, d_up], dim=1) if up_weight is None else None
    if up_weight is None:
        assert d is not None
        gx = mm(d, weight).reshape(x.shape) if needs[0] else None
        gw = mm(d.mT, x2) if needs[1] else None
        gb = d.sum(0) if needs[3] and bias is not None else None
        return gx, gw, None, gb, None
    gx = (mm(d_gate, weight) + mm(d_up, up_weight)).reshape(x.shape) if needs[0] else None
    gw = mm(d_gate.mT, x2) if needs[1] else None
    guw = mm(d_up.mT, x2) if needs[2] else None
    gb = d_gate.sum(0) if needs[3] and bias is not None else None
    gub = d_up.sum(0) if needs[4] and up_bias is not None else None
    return gx, gw, guw, gb, gub


def _eager_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _matmul_ops()[0](a, b)


def _eager_lin(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return _matmul_ops()[1](x, w, b)


_matmul_pair: Any = None


def _matmul_ops() -> Any:
    """(``matmul``, ``linear``) of ``xkernels.ops.matmul``, imported on first use (that package
    imports after this one) and kept: the backward calls them per GEMM."""
    global _matmul_pair
    if _matmul_pair is None:
        from xkernels.ops.matmul import linear, matmul

        _matmul_pair = (matmul, linear)
    return _matmul_pair


class GatedLinearFunction(torch.autograd.Function):
    """A ``gated_linear`` call that needs a gradient, either route: ``run()`` gives ``(y, gate,
    up, backend)`` (gate and up kept: the fused kernel's ``STORE_PRE``, or the BLAS's results on
    the vendor route). The backward reads them in one element-wise kernel (``gate_grads``), then
    the GEMMs. A backward that builds a graph (``create_graph``) differentiates PyTorch's
    composition at the same inputs instead, so second derivatives are PyTorch's."""

    @staticmethod
    def forward(ctx: Any, run: Any, x: torch.Tensor, weight: torch.Tensor, up_weight: torch.Tensor | None,
                bias: torch.Tensor | None, up_bias: torch.Tensor | None, activation: str) -> torch.Tensor:
        y, gate, up, backend = run()
        ctx.save_for_backward(x, weight, up_weight, bias, up_bias, gate, up)
        ctx.activation, ctx.backend = activation, backend
        return owned(y, x, weight, up_weight, bias, up_bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, weight, up_weight, bias, up_bias, gate, up = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[1:6])
        if torch.is_grad_enabled():  # create_graph: PyTorch's composition, differentiated again
            return (None, *_composition_grads(dy, (x, weight, up_weight, bias, up_bias), ctx.activation, needs), None)
        grads = gated_backward(dy, x, weight, up_weight, bias, up_bias, ctx.activation, gate, up, needs, _eager_mm,
                               _eager_lin, ctx.backend)
        return (None, *grads, None)


def _composition_grads(dy: torch.Tensor, inputs: tuple[Any, ...], activation: str,
                       needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, ...]:
    """The gradients ``reference_gated_linear`` has at ``inputs``, with their graph (a backward
    that builds one)."""
    y = reference_gated_linear(*inputs, activation=activation)
    want = [t for t, n in zip(inputs, needs) if n and t is not None]
    got = iter(torch.autograd.grad(y, want, dy, create_graph=True, allow_unused=True))
    return tuple(next(got) if n and t is not None else None for t, n in zip(inputs, needs))


# -- the custom op xkernels::gated_linear (torch.compile, torch.export) --------------------------
SCHEMA = ('gated_linear(Tensor x, Tensor weight, Tensor? up_weight=None, Tensor? bias=None, '
          'Tensor? up_bias=None, str activation="silu") -> Tensor')
_lib: Any = None


def _real(x: torch.Tensor, weight: torch.Tensor, up_weight: torch.Tensor | None = None,
          bias: torch.Tensor | None = None, up_bias: torch.Tensor | None = None,
          activation: str = "silu") -> torch.Tensor:
    return gated_linear.call_no_grad(x, weight, up_weight, bias, up_bias, activation)


def _fake(x: torch.Tensor, weight: torch.Tensor, up_weight: torch.Tensor | None = None,
          bias: torch.Tensor | None = None, up_bias: torch.Tensor | None = None,
          activation: str = "silu") -> torch.Tensor:
    call = gated_linear.check(x, weight, up_weight, bias, up_bias, activation)
    return torch.empty(call.out_shape, dtype=call.dtype, device=call.device)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs[:5])
    ctx.activation = inputs[5]


def _backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
    x, weight, up_weight, bias, up_bias = ctx.saved_tensors
    grads = gated_backward(dy, x, weight, up_weight, bias, up_bias, ctx.activation, None, None,
                           input_needs(ctx, 5)[:5], torch.ops.xkernels.matmul.default,
                           torch.ops.xkernels.linear.default)
    return (*grads, None)


def register() -> None:
    """Define ``xkernels::gated_linear`` (once; a fragment of the ``xkernels`` namespace, after
    ``ops/library.py`` has defined the others: its backward calls ``xkernels::matmul`` and
    ``xkernels::linear``)."""
    global _lib
    if _lib is not None or not hasattr(torch.library, "register_autograd"):  # torch < 2.4: eager only
        return
    lib = torch.library.Library("xkernels", "FRAGMENT")
    lib.define(SCHEMA)
    lib.impl("gated_linear", _real, "CompositeExplicitAutograd")
    torch.library.register_fake("xkernels::gated_linear", _fake, lib=lib)
    torch.library.register_autograd("xkernels::gated_linear", _backward, setup_context=_setup, lib=lib)
    _lib = lib


gated_linear = GatedLinear()
