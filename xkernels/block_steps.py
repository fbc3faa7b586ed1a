"""The per-call steps of ``xkernels.blocks``' fused forwards: everything a block's fusion fixes is
resolved once, when ``patch`` applies it, into a small frozen record on the module
(``module._xkernels_block``); each call reads only what can change (the parameters, the eps).

* :class:`NormStep`: ``norm(x + residual)`` (and the sum) with ``add_layer_norm`` /
  ``add_rms_norm``: which child is the norm (``None``: the module is the norm itself), its kind,
  the name of its eps attribute, the RMSNorm offset (Gemma's ``1 + weight``), whether the sum is
  returned;
* :class:`GatedStep`: ``act(x @ Wg.T + bg) * (x @ Wu.T + bu)`` with ``gated_linear``: the
  projections' names (two, or one whose output is chunked in two: Phi-3's ``gate_up_proj``, the
  gate's half first or second), the activation, and what the forward applies to the product;
* :class:`FeedForwardStep`: training's ``down(act(up(x)))`` as one autograd block
  (``ops/matmul/feed_forward.py``): the paths of the up-projection, its activation slot and the
  down-projection. It runs only where a gradient is required, the two projections are the
  ``xkernels.nn.Linear`` modules ``patch`` put there (the activation fused into the first, its slot
  ``nn.Identity``, no hooks) and the fused block's plan exists; otherwise it answers ``None`` and the
  module's own forward runs.

Per call a step reads the child modules and their parameters from the module's own ``_modules``
and ``_parameters`` dicts (what ``nn.Module.__getattr__`` reads, without its Python frame; a
parameter replaced by a plain attribute, e.g. a parametrization, is read by ``getattr``): never
cached tensors, so ``.to()``, ``load_state_dict`` and training see the current ones. Where no
gradient is required, nothing compiles and the op has routes, the op call goes through the step's
own :class:`~xkernels.ops.route.RouteCache`, keyed by every tensor argument's shape, strides,
dtype and device (``None`` for an absent one) and the eps's type: a repeat runs its route without
the op's front door; where a gradient is required the same key finds the route the op's recorded
call takes (``RouteCache.recorded``). Otherwise (an op that has no route at all, such as any op
on a backend running PyTorch) the op itself is called. While torch.compile traces, the blocks of
``xkernels.blocks`` run their class's own forward for inference calls and never reach a step; a
training call reaches :class:`NormStep`, which traces the compiled training form of add + norm
(``ops/fused/add_norm_compiled.py``) where its rule measured it faster, else the norm class's own
forward on ``x + residual``. A child
whose class is no longer the one the step was resolved for (replaced after ``patch``) takes the
general way: its kind looked up per call (``NormStep``) or the module class's own forward
(``GatedStep``).

A deep copy or pickle of the module copies the record (the ops are module-level instances; a
copied ``RouteCache`` starts empty), so the copy computes with its own parameters.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch

from xkernels import dispatch
from xkernels import nn as xnn
from xkernels.backends import native
from xkernels.dispatch import runs_kernels
from xkernels.ops import add_layer_norm, add_rms_norm, autocast, gated_linear, linear, matmul
from xkernels.ops.autocast import autocasting
from xkernels.ops.fused import add_norm_compiled, gated_linear_compiled
from xkernels.ops.fused.add_norm_plan import training_fusion_pays
from xkernels.ops.matmul import feed_forward
from xkernels.ops.op import _any_requires_grad, _capturing, _grad_enabled, _is_compiling
from xkernels.ops.route import RouteCache

_Linear = torch.nn.Linear


def as_written(x: Any) -> bool:
    """Whether a fused forward runs the code it replaces for the input ``x``: while torch.compile
    traces (the compiler fuses the adds, norms, gates and rotations itself) and where ``x``'s
    backend runs no kernels (``dispatch.runs_kernels``: the cpu backend; add + LayerNorm training
    at 4 x 64 on a CPU host cost 398 us that way against 86 for ``x + r`` and ``F.layer_norm``).
    Decided once per fused forward, before any step is called: the steps do not ask again."""
    return _is_compiling() or isinstance(x, torch.Tensor) and not runs_kernels(x.device)


def norm_block_as_written(x: Any, block: torch.nn.Module, dropout: str | None = None) -> bool:
    """:func:`as_written` for the forwards whose fused step is an add + norm (:class:`NormStep`),
    except a training call while torch.compile traces, on a device whose add_norm table has
    compiled rules (``add_norm_compiled.available``), with no active dropout in ``block`` but the
    one its fused forward hands to the step (``dropout``: the child applied to the summand right
    before the add, BERT's output blocks'): that traces the fused forward, whose step launches the
    compiled training form where its table rule measured it faster than the compiler's
    (``ops/fused/add_norm_compiled.py``; with that dropout inside its kernels, under the
    ``compiled_dropout`` rules) and traces the norm class's own forward elsewhere. Any other
    active ``nn.Dropout`` (training, ``p > 0``) keeps the class's forward: Inductor fuses the
    dropout of the summand into its add + norm kernel and its mask into the backward, passes the
    form would add."""
    if _is_compiling():
        if not (torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad):
            return True
        fused = dropout is not None and fusable_dropout(block._modules.get(dropout))
        return active_dropout(block, dropout if fused else None) or not add_norm_compiled.available(x.device, fused)
    return isinstance(x, torch.Tensor) and not runs_kernels(x.device)


def active_dropout(block: torch.nn.Module, skip: str | None = None) -> bool:
    """Whether a training-mode ``block`` holds an ``nn.Dropout`` (any of its subclasses) with
    ``p > 0``, other than its child ``skip``."""
    other = block._modules.get(skip) if skip is not None else None
    return block.training and any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 and m is not other
                                  for m in block.modules())


def fusable_dropout(m: Any) -> bool:
    """Whether ``m`` is an active ``torch.nn.Dropout`` (the class itself, training, ``0 < p < 1``,
    no hooks) that the compiled add + norm form may apply inside its kernels."""
    return type(m) is torch.nn.Dropout and m.training and 0 < m.p < 1 and not hooked(m)


# The op itself is called (``direct``) while compiling and while the op has no route at all
# (``Op._hot`` empty: an op without routes, or a backend running PyTorch, takes its full path
# anyway, and the cache's miss path would only add to it).


@dataclass(frozen=True, slots=True)
class NormStep:
    """``norm(x + residual)`` of one block (module doc)."""

    norm: str | None  # the child module; None: the block is the norm
    cls: type  # the norm's class when resolved
    layer: bool  # LayerNorm (else RMSNorm)
    eps_attr: str
    offset: float
    return_sum: bool
    general: Any  # (norm, x, residual, return_sum) -> result: the per-call lookup (xkernels.blocks.add_norm)
    weighted: bool  # False: an RMSNorm without a weight (the op's weight=None)
    routes: RouteCache = field(compare=False)
    paying: dict = field(default_factory=dict, compare=False)  # training_pays' answers

    def training_pays(self, x: torch.Tensor) -> bool:
        """Whether a LayerNorm block's training call takes the fused op here
        (``add_norm_plan.training_fusion_pays``), per size, dtype, device and backend override."""
        key = (x.numel(), x.dtype, x.device, dispatch.override_name(), native.ready() is not None)
        pays = self.paying.get(key)
        if pays is None:
            if len(self.paying) > 64:
                self.paying.clear()
            pays = self.paying[key] = training_fusion_pays(dispatch.select(x.device), x.device, x.numel(),
                                                           x.element_size())
        return pays

    def __call__(self, block: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None) -> Any:
        norm = block if self.norm is None else block._modules[self.norm]
        if type(norm) is not self.cls:  # replaced since patch(): resolve per call
            return self.general(norm, x, residual, self.return_sum)
        eps = getattr(norm, self.eps_attr)
        params = norm._parameters
        w = (params["weight"] if "weight" in params else norm.weight) if self.weighted else None
        b = (params["bias"] if "bias" in params else norm.bias) if self.layer else None
        if not same_math(x, residual, w, b):
            return self.unfused(norm, x, residual)
        if _is_compiling():  # a training call (as_written): the compiled form where its rule measured it faster
            out = add_norm_compiled.add_norm("layer" if self.layer else "rms", x, residual, w, b, eps, self.offset,
                                             self.return_sum)
            return out if out is not None else self.unfused(norm, x, residual)
        rs, direct = self.return_sum, not self.routes.op._hot
        if self.layer:
            training = _grad_enabled() and _any_requires_grad(x, residual, w, b)
            if training and not self.training_pays(x) and not _capturing(x):
                # in eager training where the fused op's host cost outweighs the bytes it saves
                # (not while a CUDA graph is captured: its replays cost no host time)
                s = x if residual is None else x + residual
                y = torch.nn.functional.layer_norm(s, (s.shape[-1],), w, b, eps)
                return (y, s) if rs else y
            if direct:
                return add_layer_norm(x, residual, w, b, eps, return_sum=rs)
            key = (x.shape, x.stride(), x.dtype, x.device,
                   None if residual is None else (residual.shape, residual.stride(), residual.dtype, residual.device),
                   None if w is None else (w.shape, w.stride(), w.dtype, w.device),
                   None if b is None else (b.shape, b.stride(), b.dtype, b.device), type(eps))
            if training:
                # training too: the fused backward measured 1.55-1.94x aten's LayerNorm backward + the
                # add's accumulation on an H100 (results/2026-11-24-h100-norm-backward-tiles)
                return self.routes.recorded(key, (x, residual, w, b, eps, rs))
            return self.routes.run(key, (x, residual, w, b, eps, rs))
        off = self.offset
        if direct:
            return add_rms_norm(x, residual, w, eps, offset=off, return_sum=rs)
        key = (x.shape, x.stride(), x.dtype, x.device,
               None if residual is None else (residual.shape, residual.stride(), residual.dtype, residual.device),
               None if w is None else (w.shape, w.stride(), w.dtype, w.device), type(eps))
        if _grad_enabled() and _any_requires_grad(x, residual, w):
            return self.routes.recorded(key, (x, residual, w, eps, off, rs))
        return self.routes.run(key, (x, residual, w, eps, off, rs))

    def dropped(self, block: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None,
                dropout: torch.nn.Module) -> Any:
        """``norm(dropout(x) + residual)`` of a training call while torch.compile traces, for a
        :func:`fusable_dropout`: the compiled form with the dropout inside its kernels where it
        takes the call; else the dropout module's own call, then :meth:`__call__`, as the block's
        forward does it."""
        norm = block if self.norm is None else block._modules[self.norm]
        if type(norm) is self.cls:
            params = norm._parameters
            w = (params["weight"] if "weight" in params else norm.weight) if self.weighted else None
            b = (params["bias"] if "bias" in params else norm.bias) if self.layer else None
            if same_math(x, residual, w, b):
                out = add_norm_compiled.add_norm("layer" if self.layer else "rms", x, residual, w, b,
                                                 getattr(norm, self.eps_attr), self.offset, self.return_sum, dropout.p)
                if out is not None:
                    return out
        return self(block, dropout(x), residual)

    def unfused(self, norm: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None) -> Any:
        """``norm(x + residual)`` as written: the add, then the norm class's own forward."""
        s = x if residual is None else x + residual
        y = type(norm).forward(norm, s)
        return (y, s) if self.return_sum else y


def same_math(x: torch.Tensor, residual: Any, weight: Any, bias: Any) -> bool:
    """Whether the fused add + norm computes what the norm class's own forward computes on
    ``x + residual``, dtypes included: the sum's dtype (torch's promotion) is every parameter's,
    and under ``torch.autocast`` it is fp32. The norm classes differ in the dtype they return for
    a half input with fp32 parameters (Llama's RMSNorm: fp32; LayerNorm and Gemma's: the
    input's), so such calls run the class's own forward. Under autocast a norm's own forward casts
    to fp32 (``layer_norm``, ``pow``, ``rsqrt`` are among autocast's fp32 ops) and runs no op
    autocast lowers (no GEMM), so on fp32 operands it computes what it computes without autocast,
    which is the fused op's math: the residual stream of mixed-precision training, fp32 parameters
    with a half branch output added to an fp32 residual, takes the fused op."""
    dtype = x.dtype
    if residual is not None and residual.dtype is not dtype:
        dtype = torch.result_type(x, residual)
    return ((weight is None or weight.dtype is dtype) and (bias is None or bias.dtype is dtype)
            and (dtype is torch.float32 or not autocasting()))


def norm_step(norm: str | None, cls: type, layer: bool, eps_attr: str, offset: float, return_sum: bool,
              general: Any, weighted: bool = True) -> NormStep:
    return NormStep(norm, cls, layer, eps_attr, offset, return_sum, general, weighted,
                    RouteCache(add_layer_norm if layer else add_rms_norm))


def _weight_and_bias(layer: torch.nn.Module) -> tuple[Any, Any]:
    """A linear layer's weight and bias, from ``_parameters`` (no ``nn.Module.__getattr__``) where there."""
    p = layer._parameters
    return (p["weight"] if "weight" in p else layer.weight), (p["bias"] if "bias" in p else layer.bias)


@dataclass(frozen=True, slots=True)
class GatedStep:
    """``act(gate(x)) * up(x)`` of one gated MLP (module doc)."""

    proj: tuple[str, ...]  # ("gate_proj", "up_proj") or ("gate_up_proj",)
    activation: str
    routes: RouteCache = field(compare=False)
    #: what the forward applies to the product, innermost first (``xkernels.gated_forms.GatedForm.chain``)
    then: tuple[tuple[str, str], ...] = ()
    gate_first: bool = True  # one projection: whether its first half is the gate's
    #: the activation slot's attribute and the kind of module ``activation`` was read from
    #: (``activation_kind``): another kind put there after ``patch()`` makes the class's own forward run
    act_slot: str = ""
    act_kind: tuple[Any, ...] = ()

    def act_swapped(self, block: torch.nn.Module) -> bool:
        """Whether the activation slot no longer holds the kind of module the step's activation is."""
        return bool(self.act_slot) and activation_kind(block._modules.get(self.act_slot)) != self.act_kind

    def finish(self, block: torch.nn.Module, y: torch.Tensor) -> torch.Tensor:
        """``then`` applied to the product ``y`` as the block's own forward applies it."""
        for kind, name in self.then:
            if kind == "module":  # the down-projection, a dropout, a norm: called as the forward calls it
                child = block._modules.get(name)  # a child without nn.Module.__getattr__'s frame
                y = (child if child is not None else getattr(block, name))(y)
            elif kind == "dropout":
                y = torch.nn.functional.dropout(y, p=getattr(block, name), training=block.training)
            else:  # "cast": T5's, to the down-projection's weight dtype
                w = getattr(block, name).weight
                if isinstance(w, torch.Tensor) and y.dtype != w.dtype and w.dtype != torch.int8:
                    y = y.to(w.dtype)
        return y

    def operands(self, block: torch.nn.Module) -> tuple[Any, Any, Any, Any] | None:
        """``(weight, up_weight, bias, up_bias)`` as ``gated_linear`` takes them, or ``None`` where
        a projection is no longer a plain ``nn.Linear``."""
        mods = block._modules
        gate = mods[self.proj[0]]
        if type(gate) is not _Linear:
            return None
        w, b = _weight_and_bias(gate)
        if len(self.proj) == 2:
            up = mods[self.proj[1]]
            if type(up) is not _Linear:
                return None
            uw, ub = _weight_and_bias(up)
        elif self.gate_first:  # one projection, the gate's half first: the op's concatenated layout
            uw = ub = None
        else:  # the gate's half second: the halves as the two weights (views)
            half = w.shape[0] // 2
            w, uw = w[half:], w[:half]
            b, ub = (None, None) if b is None else (b[half:], b[:half])
        return w, uw, b, ub

    def compiled(self, block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """While torch.compile traces: the block's output with the gated product launched as the
        fused kernel (``ops/fused/gated_linear_compiled.py``), or ``None`` where the class's own
        forward should be traced: a call needing a gradient or under autocast, or one whose plan
        the table does not show beating the device's GEMMs + Inductor's fused gate pass."""
        ops = self.operands(block)
        if ops is None or autocasting() or self.act_swapped(block):
            return None
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *ops)):  # (traceable)
            return None
        y = gated_linear_compiled.gated(x, *ops, self.activation, views=len(self.proj) == 1)
        return None if y is None else self.finish(block, y)

    def __call__(self, block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """The gated product, or ``None`` where a projection is no longer a plain ``nn.Linear``
        or an inference call runs under autocast (the caller then runs the class's own forward)."""
        act = self.activation
        ops = self.operands(block)
        if ops is None or self.act_swapped(block):
            return None
        w, uw, b, ub = ops
        if autocasting():
            # training: the projections' GEMMs in the autocast dtype, cast as F.linear's are (ops/
            # autocast.py); x once, not once per projection. An inference call runs the class's own
            # forward: its F.linear calls take autocast's weight cache, which lasts across calls
            # (a training step casts its weights anew each step either way)
            if not (_grad_enabled() and _any_requires_grad(x, w, uw, b, ub)):
                return None
            x, w, uw, b, ub = autocast.cast_all((x, w, uw, b, ub))
        if not self.routes.op._hot or _is_compiling():
            return gated_linear(x, w, uw, b, ub, act)
        key = (x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype, w.device,
               None if uw is None else (uw.shape, uw.stride(), uw.dtype, uw.device),
               None if b is None else (b.shape, b.stride(), b.dtype, b.device),
               None if ub is None else (ub.shape, ub.stride(), ub.dtype, ub.device))
        if _grad_enabled() and _any_requires_grad(x, w, uw, b, ub):
            return self.routes.recorded(key, (x, w, uw, b, ub, act))
        return self.routes.run(key, (x, w, uw, b, ub, act))


@dataclass(frozen=True)
class AddNormSteps:
    """The add + norm sites of one rewritten forward (``xkernels.add_norm_forms``): per norm child
    that takes the fused op, a :class:`NormStep` without the sum (post-norm sites) and one
    returning it (pre-norm sites)."""

    steps: dict[str, NormStep]
    summed: dict[str, NormStep] = field(default_factory=dict)

    @property
    def layer(self) -> bool:
        """Whether any is a LayerNorm (its training calls follow ``NormStep.training_pays``)."""
        return any(step.layer for steps in (self.steps, self.summed) for step in steps.values())


#: the dtypes the fused norms run in a rewritten forward or for T5's RMSNorm (others keep the source)
FUSED_NORM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _site_step(block: torch.nn.Module, name: str, a: Any, b: Any, summed: bool) -> NormStep | None:
    """The fused step of a rewritten forward's site, or ``None`` where it runs as written."""
    steps = block.__dict__.get("_xkernels_block")
    step = (steps.summed if summed else steps.steps).get(name) if type(steps) is AddNormSteps else None
    if (step is None or not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor)
            or type(block._modules.get(name)) is not step.cls or a.shape != b.shape
            or a.dtype not in FUSED_NORM_DTYPES or b.dtype not in FUSED_NORM_DTYPES or a.device != b.device
            or not runs_kernels(a.device)):  # (never while compiling: the rewritten forward is not traced)
        return None
    return step  # the sum's and parameters' dtypes are checked there (same_math)


def add_then_norm(block: torch.nn.Module, name: str, a: Any, b: Any) -> Any:
    """``self.<name>(a + b)`` in a forward ``add_norm_forms`` rewrote: the fused add + norm where
    ``name`` has a step and ``a``, ``b`` are tensors of one shape and device in fp32, fp16 or bf16
    whose sum has the norm's parameter dtype (fp32 under autocast: :func:`same_math`); else that
    expression itself (a broadcast, a number, a replaced child, other dtypes, under
    ``torch.compile``, on a backend that runs no kernels)."""
    step = _site_step(block, name, a, b, False)
    return getattr(block, name)(a + b) if step is None else step(block, a, b)


def add_norm_and_sum(block: torch.nn.Module, name: str, a: Any, b: Any) -> tuple[Any, Any]:
    """``(s, self.<name>(s))`` for ``s = a + b`` in a forward ``add_norm_forms`` rewrote (a
    pre-norm site: the sum is the next residual), fused as :func:`add_then_norm` decides, and only
    where a gradient is required or a CUDA graph is being captured. An inference call runs as
    written: the fused op saves one pass over the sum, a few µs of device time, and its Python
    path cost more host time than PyTorch's add and norm (mBART-large's forward, 8 x 512 on an
    H200, host-bound: 0.96x of torch's wall with its 36 sites fused, 1.03x with them as written;
    results/2026-12-01-h200-pre-norm-sites)."""
    tensors = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    fuses = tensors and (_grad_enabled() and (a.requires_grad or b.requires_grad) or _capturing(a))
    step = _site_step(block, name, a, b, True) if fuses else None  # (decided first: inference pays no more)
    if step is None:
        s = a + b
        return s, getattr(block, name)(s)
    y, s = step(block, a, b)
    return s, y


def activation_kind(module: Any) -> tuple[Any, ...]:
    """What an activation module computes as far as its class and its ``approximate`` (``nn.GELU``'s)
    tell: the same for a copy or a ``DataParallel`` replica, another for a module of another class.
    Read per call of a fused step: the instance ``__dict__``, not ``nn.Module.__getattr__``'s miss."""
    return (type(module), getattr(module, "__dict__", {}).get("approximate"))


def gated_step(proj: tuple[str, ...], activation: str, then: tuple[tuple[str, str], ...] = (),
               gate_first: bool = True, act_slot: str = "", act_module: Any = None) -> GatedStep:
    return GatedStep(proj, activation, RouteCache(gated_linear), then, gate_first, act_slot,
                     activation_kind(act_module) if act_slot else ())


#: the free variables of transformers' ``GradientCheckpointingLayer`` wrapper of a layer's forward
_CHECKPOINTING_WRAPPER = ("forward", "forward_with_checkpointing")


def own_forward(cls: type) -> Any:
    """``cls.forward`` as a fused forward's way back to the code it replaces: without
    transformers' checkpointing wrapper (:func:`checkpointed`), which a fused forward set on a
    checkpointed layer already runs inside (calling the wrapper again would checkpoint the layer
    inside its own checkpoint: its forward ran three times per step)."""
    fwd = cls.forward
    code = getattr(fwd, "__code__", None)
    if code is not None and code.co_freevars == _CHECKPOINTING_WRAPPER and hasattr(fwd, "__wrapped__"):
        return fwd.__wrapped__
    return fwd


def checkpointed(cls: type, fused: Any) -> Any:
    """``fused`` (a forward replacing ``cls.forward`` on an instance) under the gradient
    checkpointing ``cls.forward`` applies: transformers' ``GradientCheckpointingLayer`` wraps each
    layer class's forward (``forward_with_checkpointing``), and a forward set on the instance would
    bypass it, so ``gradient_checkpointing_enable()`` would silently keep every activation of a
    patched layer. The same wrapper code is made around ``fused``: the same checks (training,
    ``gradient_checkpointing``, the outermost class), the same ``use_cache`` handling, the same
    checkpoint call. Any other ``cls.forward``: ``fused`` itself."""
    wrapper = getattr(cls, "forward", None)
    code = getattr(wrapper, "__code__", None)
    if code is None or code.co_freevars != _CHECKPOINTING_WRAPPER or not hasattr(wrapper, "__wrapped__"):
        return fused
    made = types.FunctionType(code, wrapper.__globals__, wrapper.__name__, wrapper.__defaults__,
                              (types.CellType(fused), types.CellType(wrapper)))
    made.__kwdefaults__ = wrapper.__kwdefaults__
    made.__wrapped__ = fused  # type: ignore[attr-defined]
    return made


def child_at(block: torch.nn.Module, path: tuple[str, ...]) -> Any:
    """The module at ``path`` (child names) below ``block`` (``block`` for an empty path), or ``None``."""
    m: Any = block
    for name in path:
        m = m._modules.get(name) if isinstance(m, torch.nn.Module) else None
    return m


def hooked(m: torch.nn.Module) -> bool:
    """Whether ``m`` has forward or backward hooks, which a fused forward or a replacement would
    not run (``blocks`` and ``patching`` then leave it as it is)."""
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None))


@dataclass(frozen=True, slots=True)
class FeedForwardStep:
    """Training's ``down(act(up(x)))`` of one block (module doc)."""

    up: tuple[str, ...]  # path of the up-projection from the block
    act: tuple[str, ...]  # path of its activation slot
    down: tuple[str, ...]  # path of the down-projection
    #: path of a dropout the block's forward applies to the down-projection's output (GPT-J's and
    #: GPT-Neo's MLPs), applied by the fused forward after the node; () for none
    after: tuple[str, ...] = ()

    def __call__(self, block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """The block's output recorded as one autograd node, or ``None`` where the module's own
        forward should run (no gradient, compiling, other children, no fused plan)."""
        if not _grad_enabled() or _is_compiling():
            return None
        up, act, down = child_at(block, self.up), child_at(block, self.act), child_at(block, self.down)
        if (type(up) is not xnn.Linear or up.activation is None or type(down) is not xnn.Linear
                or down.activation is not None or type(act) is not torch.nn.Identity or hooked(up) or hooked(down)):
            return None
        pu, pd = up._parameters, down._parameters
        w1 = pu["weight"] if "weight" in pu else up.weight
        b1 = pu["bias"] if "bias" in pu else up.bias
        w2 = pd["weight"] if "weight" in pd else down.weight
        b2 = pd["bias"] if "bias" in pd else down.bias
        if not _any_requires_grad(x, w1, b1, w2, b2):
            return None
        if not (_capturing(x) or xnn._trains_through_xkernels(x, w1)):  # as the layers' own training policy
            return None
        if autocasting():  # the two GEMMs in the autocast dtype, as nn.Linear's (ops/autocast.py)
            x, w1, b1, w2, b2 = autocast.cast_all((x, w1, b1, w2, b2))
        return feed_forward.recorded(linear, matmul, x, w1, b1, w2, b2, up.activation, up.negative_slope)
