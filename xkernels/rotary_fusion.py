"""Rotary embeddings for ``xkernels.patch``: an attention module whose forward calls its modeling
module's ``apply_rotary_pos_emb`` gets the same forward with that one name bound to
``xkernels.ops.rotary_embedding`` (q and k in one kernel launch instead of about fourteen
PyTorch ops).

Detection is by behaviour, as for the block fusions: the function the forward's global
``apply_rotary_pos_emb`` names, and the ``rotate_half`` beside it, must be, statement for
statement, one of transformers' ``rotate_half`` forms below (Llama's, shared by 118 families in
transformers 5.23: Mistral, Qwen2/3, Gemma, ...; GPT-NeoX's and Phi-3's partial rotary; Olmo's,
which casts back to q's dtype), and the forward must call it by that name. Interleaved forms
(GPT-J, Cohere, GLM) and any other are left as they are, and reported.

The instance's new forward runs the class's own code object with a copy of its module's globals in
which ``apply_rotary_pos_emb`` is ``fused_rotary(original)`` (the class's forward itself while
torch.compile traces): nothing else changes, and the class and every other instance keep the
original. ``fused_rotary`` runs the op where q, k, cos and sin
share one dtype and device and the shapes are the form's own (a full-width form with a narrower
``cos`` keeps the original, which raises what it raises); the original runs every call the op's
checks refuse, and while ``torch.compile`` traces (Inductor fuses it). ``PatchReport.undo()``
removes the forward.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from xkernels.blocks import canonical
from xkernels.ops import rotary_embedding
from xkernels.ops.op import _is_compiling

NAME = "apply_rotary_pos_emb"
FUSION = "rotary embedding"

# -- the originals, as read in transformers 5.23 (docstrings and comments aside) --------------------
ROTATE_HALF = '''
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
'''

LLAMA = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
'''

OLMO = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    q_type, k_type = q.dtype, k.dtype
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed.to(q_type), k_embed.to(k_type)
'''

GPT_NEOX = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (rotate_half(k_rot) * sin)
    q_embed = torch.cat([q_embed, q_pass], dim=-1)
    k_embed = torch.cat([k_embed, k_pass], dim=-1)
    return q_embed, k_embed
'''

PHI3 = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed
'''

#: canonical source -> whether the form rotates part of the head dim (cos narrower than q)
FORMS = {LLAMA: False, OLMO: False, GPT_NEOX: True, PHI3: True}


@cache
def _forms() -> dict[str, bool]:
    return {canonical(src): partial for src, partial in FORMS.items()}


def _calls(fn: Any, name: str) -> bool:
    """Whether ``fn``'s source calls the global ``name``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(tree))


def _class_form(cls: type) -> tuple[bool | None, str | None]:
    """``(partial, None)``: the class's forward calls a known form; ``(None, why not)``: it calls
    an ``apply_rotary_pos_emb`` xkernels does not fuse; ``(None, None)``: no rotary call at all.
    Decided for the functions the module's globals name now (one rebound later, e.g. by another
    library's patch, is read again)."""
    fn = cls.__dict__.get("forward") or getattr(cls, "forward", None)
    if not isinstance(fn, types.FunctionType):
        return None, None
    scope = fn.__globals__
    return _verdict(cls, fn, scope.get(NAME), scope.get("rotate_half"))


@cache
def _verdict(cls: type, fn: Any, target: Any, rotate: Any) -> tuple[bool | None, str | None]:
    if NAME not in fn.__code__.co_names or not _calls(fn, NAME):
        return None, None
    if hasattr(fn, "__wrapped__"):
        return None, "its forward is wrapped by a decorator"
    if target is None or not callable(target):
        return None, f"{NAME} is not a function in {fn.__module__}"
    partial = _forms().get(canonical(target))
    if partial is None:
        return None, f"{fn.__module__}.{NAME} is not a rotate_half form xkernels fuses (e.g. an interleaved rotary)"
    if canonical(rotate) != canonical(ROTATE_HALF):
        return None, f"{fn.__module__}.rotate_half is not transformers' rotate_half"
    return partial, None


def fusion_for(module: torch.nn.Module) -> tuple[bool, str | None]:
    """``(True, None)``: ``module`` takes the rotary fusion; ``(True, why not)``: its forward calls
    a rotary embedding it cannot take; ``(False, None)``: no rotary embedding in its forward."""
    partial, why = _class_form(type(module))
    if partial is None:
        return why is not None, why
    if "forward" in module.__dict__:
        return True, "its forward is already replaced on the instance"
    return True, None


def fused_rotary(original: Callable[..., Any], partial: bool) -> Callable[..., Any]:
    """``apply_rotary_pos_emb`` running ``xkernels.ops.rotary_embedding`` where the call is the
    form's own with one dtype and device, else ``original``."""

    def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any = 1) -> Any:
        if (_is_compiling() or not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin))
                or not q.dtype == k.dtype == cos.dtype == sin.dtype
                or not (partial or cos.shape[-1] == q.shape[-1] == k.shape[-1])):
            return original(q, k, cos, sin, unsqueeze_dim)
        try:
            return rotary_embedding(q, k, cos, sin, unsqueeze_dim)
        except (ValueError, TypeError):  # the op's checks refuse (before any kernel runs): the original decides
            return original(q, k, cos, sin, unsqueeze_dim)

    apply_rotary_pos_emb.original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def apply(module: torch.nn.Module) -> None:
    """Give ``module`` its class's forward with ``apply_rotary_pos_emb`` bound to the fused one;
    while torch.compile traces, the class's own forward (Dynamo guards a function's globals as its
    module's, so it is never shown the copy)."""
    cls = type(module)
    fn = cls.forward
    partial, _ = _class_form(cls)
    scope = dict(fn.__globals__)
    scope[NAME] = fused_rotary(fn.__globals__[NAME], bool(partial))
    fused = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    fused.__kwdefaults__ = fn.__kwdefaults__

    @functools.wraps(fn)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return fn(self, *args, **kwargs)
        return fused(self, *args, **kwargs)

    module.forward = types.MethodType(forward, module)
