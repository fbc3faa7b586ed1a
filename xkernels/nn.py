"""Modules that compute with xkernels: drop-in replacements for ``nn.Linear`` and transformers'
``Conv1D``, with the activation fused into the matmul epilogue.

    layer = xkernels.nn.Linear(768, 3072, activation="gelu")        # an nn.Linear (isinstance holds)
    layer.load_state_dict(torch_linear.state_dict())                # same keys and shapes
    fused = xkernels.nn.Linear.from_linear(torch_linear, "relu")    # shares torch_linear's parameters

``forward`` is ``xkernels.ops.linear(x, weight, bias, activation)``: the backend of the tensors'
device runs it, and its autograd is the op's. While ``torch.compile`` traces, it is PyTorch's
``F.linear`` and the activation (Inductor fuses them itself; see ``_linear``). A repeated
inference call (no gradient required) runs the route of its signature from the linear op's native
route table where the native extension is loaded (``ops/native_front_door.py``), else from the
module's own :class:`~xkernels.ops.route.RouteCache`; either is keyed by the input's and the parameters' shape,
strides, dtype and device, the activation and the slope (read at each call: a new input, a
replaced or converted parameter, another ``use_backend`` is another key), without the op's front
door (``python -m xkernels.bench --host`` times it against ``torch.nn.Linear``). A training call
(a gradient required) runs ``F.linear`` and the activation where the GEMM time a kernel could
save does not repay xkernels' host premium on this backend (:func:`training_pays`).
"""

from __future__ import annotations

from typing import Any

import torch

from xkernels import dispatch
from xkernels.dispatch import runs_kernels
from xkernels.ops import autocast, native_front_door
from xkernels.ops.autocast import autocasting
from xkernels.ops.matmul import compiled as matmul_compiled
from xkernels.ops.matmul import linear, matmul
from xkernels.ops.matmul import pre_activation as matmul_pre
from xkernels.ops.matmul.vendor import activate
from xkernels.ops.op import _any_requires_grad, _capturing, _grad_enabled, _is_compiling
from xkernels.ops.route import RouteCache

__all__ = ["Conv1D", "Linear", "linear_activations", "training_pays"]

#: GEMMs of a linear layer's training call: the forward's and the backward's two (d(x), d(weight)).
TRAINING_GEMMS = 3
#: The fraction of a GEMM's BLAS time a kernel saves at best, for the training policy: the public
#: corpus's linear layers ran 1.18x cuBLAS (bf16 geomean, H100, results/2026-11-24-h100-gemm-corpus-launch-margin),
#: 1 - 1/1.18 = 0.15.
GEMM_SAVING = 0.15
_paying: dict[Any, bool] = {}  # (x's shape and device, backend override, weight's shape) -> training_pays
_UNSET: Any = object()  # a parameter not in a module's ``_parameters``


def training_pays(backend: Any, device: torch.device, rows: int, n: int, k: int) -> bool:
    """Whether a patched linear layer's training call (``rows`` x ``k`` -> ``n``) runs through
    xkernels in eager mode on ``backend``: the GEMM time a kernel could save on its three GEMMs
    (``GEMM_SAVING`` of their time at the device's matmul peak, measured, else its datasheet's
    bf16 figure) is at least the host time the xkernels path costs beyond ``torch.nn.Linear``'s
    (``Backend.linear_training_host_ms``). Otherwise it runs ``F.linear`` and the activation,
    PyTorch's own autograd: a host-bound step loses that premium on every layer (BERT-base:
    72 layers, ~4 ms of a 31 ms step on an H100 host) while a kernel saves ~6 us on a 768 x 768
    GEMM at 8192 tokens. A backend that runs no kernels (the cpu backend: PyTorch's ops
    either way) never: its path would only add the front door to ``F.linear``. No premium:
    always; no peak known: never."""
    if not backend.runs_triton:
        return False
    premium = backend.linear_training_host_ms
    if premium <= 0:
        return True
    try:
        props = backend.properties(device)
        fig = props.matmul_peak or props.datasheet.get("bf16_tflops")
    except Exception:  # noqa: BLE001 - an odd device's properties must not fail a training step
        fig = None
    gemm_ms = 2.0 * rows * n * k / (float(fig.value) * 1e9) if fig is not None and fig.value else 0.0
    return TRAINING_GEMMS * gemm_ms * GEMM_SAVING >= premium if gemm_ms else False


def _trains_through_xkernels(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """:func:`training_pays` for this call, remembered per input shape and device, backend
    override and weight shape (everything it reads of the call)."""
    key = (x.shape, x.device, dispatch.override_name(), weight.shape)
    pays = _paying.get(key)
    if pays is None:
        n, k = weight.shape
        pays = training_pays(dispatch.select(x.device), x.device, x.numel() // max(k, 1), n, k)
        if len(_paying) > 256:
            _paying.clear()
        _paying[key] = pays
    return pays


def linear_activations() -> tuple[str, ...]:
    """The activation names ``xkernels.ops.linear`` fuses in this build."""
    from xkernels.ops.matmul.plan import ACTIVATIONS

    return tuple(k for k in ACTIVATIONS if k)


def _check_activation(module: str, activation: str | None, negative_slope: Any) -> None:
    if activation is not None and activation not in linear_activations():
        raise ValueError(f"xkernels.nn.{module}: 'activation' must be one of {list(linear_activations())} or None, "
                         f"got {activation!r}")
    if isinstance(negative_slope, bool) or not isinstance(negative_slope, int | float):
        raise TypeError(f"xkernels.nn.{module}: 'negative_slope' must be a number, got {negative_slope!r}")


def _linear(routes: RouteCache, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            activation: str | None, negative_slope: float) -> torch.Tensor:
    """``linear(x, weight, bias, activation, negative_slope=...)``; repeats without a gradient by
    ``routes`` (the key: every argument's layout or value, ``RouteCache.run``)."""
    if _is_compiling():
        grads = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        if activation is not None and not (grads and torch.is_grad_enabled()):  # (Dynamo traces this)
            # the TMA kernel with the activation in its epilogue, launched from the graph where its
            # table rule measured it clearly faster (ops/matmul/compiled.py); else PyTorch's ops.
            # Training keeps PyTorch's ops: the form that also stores the pre-activation, in an
            # autograd Function, cost compiled BERT-base's training step 10% of wall for 1% of
            # device time (H100, results/2026-11-27-h100-compiled-ffn-kernel)
            fused = matmul_compiled.linear_activation(x, weight, bias, activation, negative_slope)
            if fused is None:  # relu / gelu_tanh: the BLAS's GEMM with its epilogue, as eager runs them
                fused = matmul_compiled.blas_epilogue(x, weight, bias, activation)
            if fused is not None:
                return fused
        # PyTorch's own F.linear + activation, which Inductor fuses itself: as xkernels::linear
        # nodes, each call into the custom op's Python kernel cost the host ~50 us at runtime
        # (H100, BERT-base under torch.compile: wall 0.52x forward, 0.64x training, for 1.05x /
        # 0.96x of device time; results/2026-11-24-h100-model-modes-masks)
        return activate(torch.nn.functional.linear(x, weight, bias), activation, negative_slope)
    if autocasting():  # the GEMM in the autocast dtype, as nn.Linear's under autocast (ops/autocast.py)
        if (_grad_enabled() and _any_requires_grad(x, weight, bias) and not _trains_through_xkernels(x, weight)
                and not _capturing(x)):
            # a training call the policy gives PyTorch (training_pays): F.linear itself, whose
            # autocast casts in C++ from its weight cache; casting here first cost BERT-base's
            # step ~3.8 ms of host (H100, results/2026-11-27-h100-autocast-training)
            y = torch.nn.functional.linear(x, weight, bias)
            return y if activation is None else activate(y, activation, negative_slope)
        x, weight, bias = autocast.cast_all((x, weight, bias))
    table = linear._native
    if table is not None:  # the op's native front door: a repeat without a gradient runs in C++
        leaky = activation == "leaky_relu"
        result = table(x, weight, bias, activation, negative_slope=negative_slope) if leaky else \
            table(x, weight, bias, activation)
        if result is not None:
            return result
    if not runs_kernels(x.device):  # the cpu backend: PyTorch's ops either way, without the op's front door
        y = torch.nn.functional.linear(x, weight, bias)  # (checked after the table: a hit never pays for it)
        return y if activation is None else activate(y, activation, negative_slope)
    training = _grad_enabled() and _any_requires_grad(x, weight, bias)
    if table is not None and not training:  # a miss: the op teaches the table
        return linear.call_no_grad(x, weight, bias, activation, negative_slope=negative_slope) \
            if activation == "leaky_relu" else linear.call_no_grad(x, weight, bias, activation)
    if training and not _trains_through_xkernels(x, weight) and not _capturing(x):
        # PyTorch's F.linear and activation, its own autograd: see training_pays (not while a CUDA
        # graph is captured: its replays cost no host time). The native table runs the repeats.
        y = torch.nn.functional.linear(x, weight, bias)
        if table is not None:
            native_front_door.teach_torch_linear(table, (x, weight, bias, activation),
                                                 {"negative_slope": negative_slope} if activation == "leaky_relu" else {},
                                                 bias is not None, activation, negative_slope)
        return y if activation is None else activate(y, activation, negative_slope)
    key = (x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(), weight.dtype, weight.device,
           None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device), activation, negative_slope)
    canon = (x, weight, bias, activation, negative_slope, None, None)
    if training:
        if linear.splits(activation, negative_slope):  # as linear's own autograd
            fused = matmul_pre.recorded(linear, matmul, x, weight, bias, activation, negative_slope)
            if fused is not None:  # one kernel writes the output and the pre-activation
                return fused
            plain = routes.recorded((*key[:-2], None, 0.01), (x, weight, bias, None, 0.01, None, None))
            return activate(plain, activation, negative_slope)
        return routes.recorded(key, canon)
    return routes.run(key, canon)


class Linear(torch.nn.Linear):
    """``nn.Linear`` followed by ``activation`` (``None`` or one of :func:`linear_activations`),
    computed by ``xkernels.ops.linear``. Parameters, ``state_dict``, init and ``.to()`` are
    ``nn.Linear``'s; ``negative_slope`` is leaky_relu's."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None, dtype: Any = None,
                 *, activation: str | None = None, negative_slope: float = 0.01) -> None:
        _check_activation("Linear", activation, negative_slope)
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation
        self.negative_slope = float(negative_slope)
        self._routes = RouteCache(linear)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, activation: str | None = None, *,
                    negative_slope: float = 0.01) -> Linear:
        """A module computing ``activation(linear(x))`` with ``linear``'s own parameters (shared,
        not copied: an optimiser holding them keeps working); ``training`` is carried over."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"xkernels.nn.Linear.from_linear: 'linear' must be a torch.nn.Linear, got {type(linear)}")
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta",
                  dtype=linear.weight.dtype, activation=activation, negative_slope=negative_slope)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the parameters from their dict (nn.Module.__getattr__ costs ~10x a dict lookup per read);
        # where a parametrization or a hook moved one out of it, the attribute
        p = self._parameters
        weight, bias = p.get("weight", _UNSET), p.get("bias", _UNSET)
        return _linear(self._routes, x, self.weight if weight is _UNSET else weight,
                       self.bias if bias is _UNSET else bias, self.activation, self.negative_slope)

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation else ""
        slope = f", negative_slope={self.negative_slope}" if self.activation == "leaky_relu" else ""
        return super().extra_repr() + act + slope


class Conv1D(torch.nn.Module):
    """transformers' ``Conv1D`` (GPT-2's projections: ``x @ weight + bias`` with ``weight`` of
    shape ``(nx, nf)`` = (in, out)) followed by ``activation``, computed by
    ``xkernels.ops.linear``. Same parameters, ``state_dict`` keys and shapes, and init."""

    def __init__(self, nf: int, nx: int, *, activation: str | None = None, negative_slope: float = 0.01,
                 device: Any = None, dtype: Any = None) -> None:
        _check_activation("Conv1D", activation, negative_slope)
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = torch.nn.Parameter(torch.empty(nx, nf, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(nf, device=device, dtype=dtype))
        if self.weight.device.type != "meta":
            torch.nn.init.normal_(self.weight, std=0.02)
        self.activation = activation
        self.negative_slope = float(negative_slope)
        self._routes = RouteCache(linear)

    @classmethod
    def from_conv1d(cls, conv: torch.nn.Module, activation: str | None = None, *,
                    negative_slope: float = 0.01) -> Conv1D:
        """A module computing ``activation(conv(x))`` for a transformers ``Conv1D`` (anything with
        ``weight`` (nx, nf), ``bias`` (nf,), ``nf`` and ``nx``), sharing its parameters."""
        weight = getattr(conv, "weight", None)
        if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 2:
            raise TypeError(f"xkernels.nn.Conv1D.from_conv1d: 'conv' needs a 2-D 'weight' parameter, got {type(conv)}")
        new = cls(weight.shape[1], weight.shape[0], activation=activation, negative_slope=negative_slope,
                  device="meta", dtype=weight.dtype)
        new.weight = weight
        new.bias = conv.bias
        new.train(conv.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(self._routes, x, self.weight.t(), self.bias, self.activation, self.negative_slope)

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation else ""
        return f"nf={self.nf}, nx={self.nx}{act}"
