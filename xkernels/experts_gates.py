"""The mixture-of-experts gates ``patch()`` fuses (``xkernels/blocks.py``'s ``experts gate`` and
``experts gate (clamped)`` fusions): the ``_apply_gate`` methods they replace, as transformers
5.23 writes them, the record each fused module keeps, and the fused methods.

* ``experts gate``: ``act_fn(gate) * up`` of the chunked gate_up result of every routed token
  (transformers' ``@use_experts_implementation`` default; Beam's computed in fp32), as
  ``ops/fused/gated_activation.gated_activation``'s one pass each way;
* ``experts gate (clamped)``: GPT-OSS's ``(clamp(up) + 1) * c * sigmoid(alpha c)``, ``c =
  min(gate, limit)``, on interleaved columns, its chunked copies (OpenAI's privacy filter,
  MiniMax-M3-VL) and the SiLU of the clamped gate (DeepSeek-V4, GLM-5-Next, HY-V4), as
  ``clamped_gated_activation``; the numbers read from the module at every call.

A fused method runs the class's own ``_apply_gate`` where the pass does not apply (the cpu
backend, compiling, another dtype: ``None`` from the op) or where the activation module in
``act_fn`` is of another kind than the one ``patch()`` saw (``activation_kind``).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from xkernels.block_steps import activation_kind, as_written, hooked
from xkernels.ops.fused.gated_activation import clamped_gated_activation, gated_activation
from xkernels.patterns import activation_of
from xkernels.source_forms import function_node

EXPERTS_APPLY_GATE = '''
def _apply_gate(self, gate_up_out):
    gate, up = gate_up_out.chunk(2, dim=-1)
    return self.act_fn(gate) * up
'''


#: the same computed in fp32 and rounded once (Beam's): what the pass does for every dtype
EXPERTS_FP32_APPLY_GATE = '''
def _apply_gate(self, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return (self.act_fn(gate.float()) * up.float()).to(gate.dtype)
'''


@dataclass(frozen=True)
class ExpertsGate:
    """The experts' gate record: the activation's name and the kind of ``act_fn`` it was read from
    (``activation_kind``; another kind there after ``patch()`` makes the class's own gate run)."""

    activation: str | None
    act_kind: tuple[Any, ...] = ()
    clamped: ClampedGateForm | None = None  # a clamped gate: where its numbers are
    #: the class's experts interface where ``patch()`` also set the routed forward (``experts_forward.py``)
    routed: Any = None


def _act_swapped(module: Any, rec: ExpertsGate) -> bool:
    return bool(rec.act_kind) and activation_kind(module._modules.get("act_fn")) != rec.act_kind


def experts_gate(self: Any, gate_up_out: torch.Tensor) -> torch.Tensor:
    rec = self._xkernels_block
    y = None if as_written(gate_up_out) or _act_swapped(self, rec) else gated_activation(gate_up_out, rec.activation)
    return y if y is not None else type(self)._apply_gate(self, gate_up_out)


#: GPT-OSS's clamped gate (interleaved halves), as its experts (and GptOssExperts' copies) define it
GPT_OSS_APPLY_GATE = '''
def _apply_gate(self, gate_up):
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=self.limit)
    up = up.clamp(min=-self.limit, max=self.limit)
    glu = gate * torch.sigmoid(gate * self.alpha)
    gated_output = (up + 1) * glu
    return gated_output
'''
#: the same with chunked halves: OpenAI's privacy filter
GPT_OSS_CHUNKED_APPLY_GATE = GPT_OSS_APPLY_GATE.replace("gate_up[..., ::2], gate_up[..., 1::2]", "gate_up.chunk(2, dim=-1)")
#: the same again, chunked, its attributes named swiglu_*: MiniMax-M3-VL
SWIGLU_LIMIT_APPLY_GATE = '''
def _apply_gate(self, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=self.swiglu_limit)
    up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
    glu = gate * torch.sigmoid(gate * self.swiglu_alpha)
    return (up + 1.0) * glu
'''
#: DeepSeek-V4's: act_fn(min(gate, limit)) * clamp(up), fused where act_fn is SiLU (alpha 1, no shift)
CLAMPED_ACT_APPLY_GATE = '''
def _apply_gate(self, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=self.limit)
    up = up.clamp(min=-self.limit, max=self.limit)
    return self.act_fn(gate) * up
'''
#: GLM-5-Next's and HY-V4's: F.silu of the clamped gate (alpha 1, no shift), the limit named swiglu_limit
CLAMPED_SILU_APPLY_GATE = '''
def _apply_gate(self, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(min=None, max=self.swiglu_limit)
    up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
    return F.silu(gate) * up
'''


@cache
def loop_applies_gate(cls: type) -> bool:
    """Whether ``cls``'s own forward (transformers' ``eager`` experts loop) calls
    ``self._apply_gate`` (GPT-OSS's does; Mixtral's computes the gate inline)."""
    fn = function_node(inspect.unwrap(getattr(cls, "forward", None)))
    return fn is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "_apply_gate"
        and isinstance(n.func.value, ast.Name) and n.func.value.id == "self" for n in ast.walk(fn))


@dataclass(frozen=True)
class ClampedGateForm:
    """Where a clamped experts' gate finds its numbers: the attributes of ``limit`` and ``alpha``
    (``None``: alpha 1, SiLU), the ``shift`` added to the clamped up, the halves' layout, and
    whether the gate's activation is the module's ``act_fn`` (then it must be SiLU). Read from the
    module at every call."""

    limit: str
    alpha: str | None
    shift: float
    interleaved: bool
    act_fn: bool = False


def experts_clamped_gate(self: Any, gate_up: torch.Tensor) -> torch.Tensor:
    rec = self._xkernels_block
    form = rec.clamped
    y = None if as_written(gate_up) or _act_swapped(self, rec) else clamped_gated_activation(
        gate_up, alpha=1.0 if form.alpha is None else getattr(self, form.alpha), limit=getattr(self, form.limit),
        shift=form.shift, interleaved=form.interleaved)
    return y if y is not None else type(self)._apply_gate(self, gate_up)


def clamped_gate_problem(form: ClampedGateForm) -> Callable[[torch.nn.Module], str | None]:
    def problem(m: torch.nn.Module) -> str | None:
        if form.act_fn and gate_activation(getattr(m, "act_fn", None)) != "silu":
            return f"act_fn ({type(getattr(m, 'act_fn', None)).__name__}) is not SiLU"
        for attr in (form.limit, form.alpha):
            value = getattr(m, attr, None) if attr is not None else 1.0
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                return f"{attr} is {type(value).__name__}, not a number"
        return None
    return problem


def gate_activation(act: Any) -> str | None:
    """The name of ``act``'s activation where ``xkernels.ops.gated_linear`` takes it, else ``None``."""
    from xkernels.ops.fused.gated_linear import ACTIVATIONS

    found = activation_of(act) if isinstance(act, torch.nn.Module) else "not a module"
    if isinstance(found, str) or found[0] not in ACTIVATIONS or hooked(act):
        return None
    return found[0]


def experts_gate_problem(m: torch.nn.Module) -> str | None:
    if gate_activation(getattr(m, "act_fn", None)) is None:
        return f"act_fn ({type(getattr(m, 'act_fn', None)).__name__}) is not an activation xkernels.ops.gated_linear takes"
    return None


#: each clamped form's original and where its numbers are
CLAMPED_GATES = ((GPT_OSS_APPLY_GATE, ClampedGateForm("limit", "alpha", 1.0, True)),
                 (GPT_OSS_CHUNKED_APPLY_GATE, ClampedGateForm("limit", "alpha", 1.0, False)),
                 (SWIGLU_LIMIT_APPLY_GATE, ClampedGateForm("swiglu_limit", "swiglu_alpha", 1.0, False)),
                 (CLAMPED_ACT_APPLY_GATE, ClampedGateForm("limit", None, 0.0, False, act_fn=True)),
                 (CLAMPED_SILU_APPLY_GATE, ClampedGateForm("swiglu_limit", None, 0.0, False)))
