"""Rotary embeddings for ``xkernels.patch``: an attention module whose forward calls its modeling
module's ``apply_rotary_pos_emb`` gets the same forward with that one name bound to
``xkernels.ops.rotary_embedding`` (q and k in one kernel launch instead of about fourteen
PyTorch ops).

Detection is by behaviour, as for the block fusions: the function the forward's global
``apply_rotary_pos_emb`` names, and the ``rotate_half`` beside it, must be, statement for
statement, one of transformers' forms below, and the forward must call it by that name:

* ``rotate_half`` pairing the halves: Llama's (shared by 118 families in transformers 5.23:
  Mistral, Qwen2/3, Gemma, ...), GPT-NeoX's, Phi-3's and Nemotron's partial rotary, OLMo's (cast
  back to q's dtype), ModernBERT's (computed in fp32, cast back); GPT-OSS's ``_apply_rotary_emb``
  of the halves, whose cos / sin are half the head dim (each taken twice);
* ``rotate_half`` pairing adjacent columns (the op's ``interleaved=True``): Cohere's (computed in
  fp32, cast back), GLM's partial rotary, Helium's and Ernie 4.5's (each taking the first half of
  ``cos`` / ``sin``, every column twice), and BLT's (Llama's apply with Cohere's rotation).
* NanoChat's ``rotate_half``, minus Llama's (its halves swapped with the other sign), in the
  full-width q, k forms: the op with ``-sin`` (made once per forward, kept as the halved forms' are).
* DINOv3's (also Sapiens2's and EoMT-DINOv3's) on the patch tokens after the cls and register
  tokens: the op on those tokens' rows, the prefix joined back as the original joins it.
* the vision towers' ``apply_rotary_pos_emb_vision`` (Qwen2-VL / 2.5-VL / 3-VL, GLM-4V and 21
  more): q, k ``(tokens, heads, d)`` taken to fp32 as the original takes them, one launch, cast back.
* GPT-J's and CodeGen's per-tensor ``apply_rotary_pos_emb(tensor, sin, cos)`` with
  ``rotate_every_two`` (adjacent pairs, sin / cos one column per pair), and Gemma 3n's and 4's
  ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)`` (Llama's rotation of one tensor): each call
  runs the op on its one tensor.

Any other form is left as it is, and reported.

The instance's new forward runs the class's own code object with a copy of its module's globals in
which the name it calls (``apply_rotary_pos_emb`` or ``apply_rotary_pos_emb_vision``) is
``fused_rotary(original)`` (the class's forward itself while
torch.compile traces): nothing else changes, and the class and every other instance keep the
original. ``fused_rotary`` runs the op where q, k, cos and sin
share one dtype and device (or q and k are fp16 / bf16 and the angles fp32, autocast's residual
stream: q and k in fp32, the results in the original's dtypes) and the shapes are the form's own
(a full-width form with a narrower ``cos`` keeps the original, which raises what it raises); the
original runs every call the op's
checks refuse, while ``torch.compile`` traces (Inductor fuses it) and where q's backend runs no
kernels (the cpu backend: ``block_steps.as_written``). ``PatchReport.undo()`` removes the forward.
"""

from __future__ import annotations

import ast
import functools
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import torch

from xkernels.block_steps import as_written
from xkernels.ops import rotary_embedding
from xkernels.ops.op import _capturing, _is_compiling
from xkernels.source_forms import canonical, source_tree

NAME = "apply_rotary_pos_emb"
#: the global names a forward's rotary call may have: the text models', and the vision towers'
#: (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, ...)
NAMES = (NAME, "apply_rotary_pos_emb_vision")
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

COHERE = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    dtype = q.dtype
    q = q.float()
    k = k.float()
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed.to(dtype=dtype), k_embed.to(dtype=dtype)
'''

HELIUM = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
    sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
'''

ERNIE = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    original_dtype = q.dtype
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
    sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
    q_embed = (q.float() * cos) + (rotate_half(q).float() * sin)
    k_embed = (k.float() * cos) + (rotate_half(k).float() * sin)
    return q_embed.to(original_dtype), k_embed.to(original_dtype)
'''

GLM = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
    sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (rotate_half(k_rot) * sin)
    q_embed = torch.cat([q_embed, q_pass], dim=-1)
    k_embed = torch.cat([k_embed, k_pass], dim=-1)
    return q_embed, k_embed
'''

MODERNBERT = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    original_dtype = q.dtype
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q.float() * cos) + (rotate_half(q.float()) * sin)
    k_embed = (k.float() * cos) + (rotate_half(k.float()) * sin)
    return q_embed.to(original_dtype), k_embed.to(original_dtype)
'''

NEMOTRON = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rot_dim = cos.shape[-1]
    q, q_pass = q[..., :rot_dim], q[..., rot_dim:]
    k, k_pass = k[..., :rot_dim], k[..., rot_dim:]
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return torch.cat((q_embed, q_pass), dim=-1), torch.cat((k_embed, k_pass), dim=-1)
'''

GEMMA_ONE = '''
def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (x * cos) + (rotate_half(x) * sin)
'''

GPT_OSS = '''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = _apply_rotary_emb(q, cos, sin)
    k_embed = _apply_rotary_emb(k, cos, sin)
    return q_embed, k_embed
'''

# DINOv3's (also Sapiens2's, EoMT-DINOv3's): the patch tokens only, after the cls and register
# tokens; cos / sin (patches, head dim), one row per patch token
DINOV3 = '''
def apply_rotary_pos_emb(q, k, cos, sin, **kwargs):
    num_tokens = q.shape[-2]
    num_patches = sin.shape[-2]
    num_prefix_tokens = num_tokens - num_patches
    q_prefix_tokens, q_patches = q.split((num_prefix_tokens, num_patches), dim=-2)
    k_prefix_tokens, k_patches = k.split((num_prefix_tokens, num_patches), dim=-2)
    q_patches = (q_patches * cos) + (rotate_half(q_patches) * sin)
    k_patches = (k_patches * cos) + (rotate_half(k_patches) * sin)
    q = torch.cat((q_prefix_tokens, q_patches), dim=-2)
    k = torch.cat((k_prefix_tokens, k_patches), dim=-2)
    return q, k
'''

# the vision towers' (25 families in transformers 5.23: Qwen2-VL / 2.5-VL / 3-VL, Qwen2.5-Omni,
# GLM-4V, Kimi-K2.5, PaddleOCR-VL, ...): q, k (tokens, heads, d), cos / sin (tokens, d), all in fp32,
# the results cast back to q's and k's dtypes
VISION = '''
def apply_rotary_pos_emb_vision(q, k, cos, sin):
    orig_q_dtype = q.dtype
    orig_k_dtype = k.dtype
    q, k = q.float(), k.float()
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    q_embed = q_embed.to(orig_q_dtype)
    k_embed = k_embed.to(orig_k_dtype)
    return q_embed, k_embed
'''

ROTATE_HALVES_GPT_OSS = '''
def _apply_rotary_emb(x, cos, sin):
    first_half, second_half = torch.chunk(x, 2, dim=-1)
    first_ = first_half * cos - second_half * sin
    second_ = second_half * cos + first_half * sin
    return torch.cat((first_, second_), dim=-1)
'''

# NanoChat's: the halves swapped with the other sign, i.e. minus Llama's rotate_half (the op's with -sin)
ROTATE_HALF_NEGATED = '''
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((x2, -x1), dim=-1)
'''

ROTATE_PAIRS = '''
def rotate_half(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    rot_x = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return rot_x
'''

ROTATE_PAIRS_GLM = '''
def rotate_half(x):
    x1 = x[..., 0::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)
'''

# GPT-J's and CodeGen's: one tensor (b, s, heads, R) per call, sin / cos (b, s, R/2), one per pair
GPTJ = '''
def apply_rotary_pos_emb(tensor, sin, cos):
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    return (tensor * cos) + (rotate_every_two(tensor) * sin)
'''

ROTATE_EVERY_TWO = '''
def rotate_every_two(x):
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)
'''


@dataclass(frozen=True)
class Form:
    """What one ``apply_rotary_pos_emb`` with its ``rotate_half`` computes."""

    partial: bool  # rotates part of the head dim (cos narrower than q)
    halved: bool = False  # takes cos / sin's first half, every column twice (``repeat_interleave``)
    #: cos / sin are half the rotary width, read by both halves (GPT-OSS's): the op's are them twice
    half_width: bool = False
    interleaved: bool = False  # its rotate_half pairs adjacent columns
    #: one tensor per call: ``"tensor, sin, cos"`` (GPT-J's: sin / cos one column per pair) or
    #: ``"x, cos, sin"`` (Gemma 3n's and 4's: cos / sin as Llama's, ``unsqueeze_dim`` as the fourth)
    per_tensor: str | None = None
    rotation: str = "rotate_half"  # the global name of the rotation it calls
    negated: bool = False  # its rotation is minus transformers' usual one (NanoChat's): the op's sin is -sin
    #: rotates the last ``cos.shape[-2]`` tokens of (b, heads, tokens, d) q / k, the prefix tokens
    #: before them kept (DINOv3's patches after its cls and register tokens); cos / sin (patches, d)
    patches: bool = False
    #: the vision towers' ``apply_rotary_pos_emb_vision(q, k, cos, sin)``: (tokens, heads, d) q / k,
    #: (tokens, d) cos / sin, computed in fp32 and cast back
    vision: bool = False
    name: str = NAME  # the global name the forward calls it by


#: canonical source of an ``apply_rotary_pos_emb`` -> the form, its rotation aside
FORMS = {LLAMA: Form(False), OLMO: Form(False), GPT_NEOX: Form(True), PHI3: Form(True), COHERE: Form(False),
         HELIUM: Form(False, halved=True), ERNIE: Form(False, halved=True), GLM: Form(True, halved=True),
         GPTJ: Form(False, per_tensor="tensor, sin, cos", rotation="rotate_every_two"),
         MODERNBERT: Form(False), NEMOTRON: Form(True), GEMMA_ONE: Form(False, per_tensor="x, cos, sin"),
         GPT_OSS: Form(False, half_width=True, rotation="_apply_rotary_emb"), DINOV3: Form(False, patches=True),
         VISION: Form(False, vision=True)}
#: canonical source of a rotation -> (whether it pairs adjacent columns, whether it is negated)
ROTATIONS = {ROTATE_HALF: (False, False), ROTATE_PAIRS: (True, False), ROTATE_PAIRS_GLM: (True, False),
             ROTATE_EVERY_TWO: (True, False), ROTATE_HALVES_GPT_OSS: (False, False),
             ROTATE_HALF_NEGATED: (False, True)}
#: the global names a form's rotation may have (``Form.rotation``)
ROTATION_NAMES = ("rotate_half", "rotate_every_two", "_apply_rotary_emb")


@cache
def _forms() -> dict[str | None, Form]:
    return {canonical(src): form for src, form in FORMS.items()}


@cache
def _rotations() -> dict[str | None, tuple[bool, bool]]:
    return {canonical(src): how for src, how in ROTATIONS.items()}


def _calls(fn: Any, name: str) -> bool:
    """Whether ``fn``'s source calls the global ``name``."""
    tree = source_tree(fn)
    if tree is None:
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(tree))


def _class_form(cls: type) -> tuple[Form | None, str | None]:
    """``(form, None)``: the class's forward calls a known form; ``(None, why not)``: it calls an
    ``apply_rotary_pos_emb`` xkernels does not fuse; ``(None, None)``: no rotary call at all.
    Decided for the functions the module's globals name now (one rebound later, e.g. by another
    library's patch, is read again)."""
    fn = cls.__dict__.get("forward") or getattr(cls, "forward", None)
    if not isinstance(fn, types.FunctionType):
        return None, None
    scope = fn.__globals__
    name = next((n for n in NAMES if n in fn.__code__.co_names), None)
    if name is None:
        return None, None
    return _verdict(cls, fn, name, scope.get(name), tuple(scope.get(n) for n in ROTATION_NAMES))


@cache
def _verdict(cls: type, fn: Any, name: str, target: Any,
             rotations: tuple[Any, ...]) -> tuple[Form | None, str | None]:
    if not _calls(fn, name):
        return None, None
    if hasattr(fn, "__wrapped__"):
        return None, "its forward is wrapped by a decorator"
    if target is None or not callable(target):
        return None, f"{name} is not a function in {fn.__module__}"
    form = _forms().get(canonical(target))
    if form is None:
        return None, f"{fn.__module__}.{name} is not a form xkernels fuses"
    rotate = rotations[ROTATION_NAMES.index(form.rotation)]
    how = _rotations().get(canonical(rotate))
    if how is None:
        return None, f"{fn.__module__}.{form.rotation} is not one of transformers' rotations"
    pairs, negated = how
    if negated and (form.halved or form.half_width or form.per_tensor or form.patches or form.vision):
        return None, f"{fn.__module__}.{form.rotation} is negated, which xkernels fuses only in full-width q, k forms"
    return replace(form, interleaved=pairs, negated=negated, name=name), None


def fusion_for(module: torch.nn.Module) -> tuple[bool, str | None]:
    """``(True, None)``: ``module`` takes the rotary fusion; ``(True, why not)``: its forward calls
    a rotary embedding it cannot take; ``(False, None)``: no rotary embedding in its forward."""
    form, why = _class_form(type(module))
    if form is None:
        return why is not None, why
    if "forward" in module.__dict__:
        return True, "its forward is already replaced on the instance"
    return True, None


class _Halves:
    """A halved form's ``cos[..., :R/2].repeat_interleave(2, -1)`` (and sin's; ``how="pairs"``:
    the whole of each repeated, GPT-J's one column per pair; ``how="twice"``: the whole twice,
    ``torch.cat((cos, cos), -1)``, GPT-OSS's half-width angles; ``how="negated sin"``: cos and
    -sin, for a negated rotation), kept for the last cos / sin seen: a
    model hands every layer (GPT-J: both calls of a layer) the same two tensors. Reused only for those very
    tensors at the same version, and only in the mode it was made in: one made while a CUDA graph
    captures is read by the graph's later layers (the graph recomputes it at each replay); one
    made outside is never read by a graph (a replay runs no Python to see new values)."""

    __slots__ = ("kept", "how")  # (inference tensors: never kept, see __call__)

    def __init__(self, how: str = "first half, pairs") -> None:
        # (key, made) in one attribute, read and replaced whole: threads sharing the model (a
        # server's, nn.DataParallel's replicas) never pair one call's key with another's tensors
        self.kept: tuple[tuple[Any, ...], Any] = ((), None)
        self.how = how

    def __call__(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if cos.is_inference() or sin.is_inference():  # no version counter to see an in-place write: made anew
            return self._made(cos, sin)
        key = (cos, sin, cos._version, sin._version, _capturing(cos))
        old, made = self.kept
        if old and old[0] is cos and old[1] is sin and old[2:] == key[2:]:
            return made
        made = self._made(cos, sin)
        self.kept = (key, made)
        return made

    def _made(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.how == "twice":
            return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        if self.how == "negated sin":
            return cos, -sin
        if self.how != "pairs":
            half = cos.shape[-1] // 2
            cos, sin = cos[..., :half], sin[..., :half]
        return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)


def fused_rotary(original: Callable[..., Any], form: Form) -> Callable[..., Any]:
    """``apply_rotary_pos_emb`` running ``xkernels.ops.rotary_embedding`` where the call is the
    form's own with one dtype and device, else ``original``."""
    if form.per_tensor == "x, cos, sin":
        return _fused_one_tensor(original, form)
    if form.per_tensor:
        return _fused_per_tensor(original, form)
    if form.patches:
        return _fused_patches(original, form)
    if form.vision:
        return _fused_vision(original, form)
    halves = (_Halves() if form.halved else _Halves("twice") if form.half_width
              else _Halves("negated sin") if form.negated else None)
    partial, interleaved = form.partial, form.interleaved
    widths = 2 if form.half_width else 1  # q's rotary width over cos's

    results: dict = {}  # (q's dtype, cos's dtype) -> the original's result dtypes (mixed calls)

    def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any = 1) -> Any:
        if (as_written(q) or not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin))
                or not q.dtype == k.dtype or not cos.dtype == sin.dtype or cos.requires_grad or sin.requires_grad
                or cos.dim() == 0 or not (partial or cos.shape[-1] * widths // 2 * 2 == q.shape[-1] == k.shape[-1])):
            return original(q, k, cos, sin, unsqueeze_dim)
        back, qf, kf = None, q, k
        if q.dtype is not cos.dtype:  # a half q, k and fp32 angles (autocast's): in fp32, as the formula promotes
            back = _promoted(results, original, q, k, cos, sin, unsqueeze_dim)
            if back is None:
                return original(q, k, cos, sin, unsqueeze_dim)
            qf, kf = q.float(), k.float()
        try:
            if halves is not None:
                c, s = halves(cos, sin)
                out = rotary_embedding(qf, kf, c, s, unsqueeze_dim, interleaved)
            else:
                out = rotary_embedding(qf, kf, cos, sin, unsqueeze_dim, interleaved)
        except (ValueError, TypeError):  # the op's checks refuse (before any kernel runs): the original decides
            return original(q, k, cos, sin, unsqueeze_dim)
        if back is None:
            return out
        return out[0].to(back[0]), out[1].to(back[1])

    apply_rotary_pos_emb.original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


_HALF = (torch.float16, torch.bfloat16)


def _promoted(results: dict, original: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, unsqueeze_dim: Any) -> tuple[torch.dtype, torch.dtype] | None:
    """The dtypes of ``original``'s results for a half ``q``, ``k`` with fp32 ``cos``, ``sin``, or
    ``None`` for any other mix. Under ``torch.autocast`` a model with fp32 parameters keeps an fp32
    residual stream, so its rotary embedding makes fp32 angles for bf16 q and k. Each form's
    formula multiplies q and k by the angles (promoting them to fp32, exactly) and otherwise only
    slices, negates and joins them, so it computes what it computes on fp32 q and k; its results
    are fp32, or q's and k's dtypes where the form casts back (OLMo, Cohere). Which, is read once
    per dtype mix from the original run on meta tensors of the call's shapes."""
    if not (q.dtype in _HALF and cos.dtype is torch.float32):
        return None
    key = (q.dtype, cos.dtype)
    found = results.get(key)
    if found is None:
        try:
            metas = [torch.empty_like(t, device="meta") for t in (q, k, cos, sin)]
            qe, ke = original(*metas, unsqueeze_dim)
            found = (qe.dtype, ke.dtype)
        except Exception:  # noqa: BLE001 - a form meta tensors cannot run: the original decides every call
            found = ()
        results[key] = found
    return found or None


def _fused_per_tensor(original: Callable[..., Any], form: Form) -> Callable[..., Any]:
    """GPT-J's ``apply_rotary_pos_emb(tensor, sin, cos)``: ``tensor`` ``(b, s, heads, R)`` as the
    op's q (its k: none, an empty slice of it), sin / cos ``(b, s, R/2)`` repeated per pair."""
    halves = _Halves("pairs")
    interleaved = form.interleaved

    def apply_rotary_pos_emb(tensor: Any, sin: Any, cos: Any) -> Any:
        if (as_written(tensor) or not all(isinstance(t, torch.Tensor) for t in (tensor, sin, cos))
                or not tensor.dtype == sin.dtype == cos.dtype or sin.requires_grad or cos.requires_grad
                or tensor.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape
                or 2 * cos.shape[-1] != tensor.shape[-1]):
            return original(tensor, sin, cos)
        try:
            c, s = halves(cos, sin)
            return rotary_embedding(tensor, tensor[:, :, :0], c, s, 2, interleaved)[0]
        except (ValueError, TypeError):  # the op's checks refuse (before any kernel runs): the original decides
            return original(tensor, sin, cos)

    apply_rotary_pos_emb.original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def _fused_patches(original: Callable[..., Any], form: Form) -> Callable[..., Any]:
    """DINOv3's ``apply_rotary_pos_emb(q, k, cos, sin)``: the op on the last P tokens of q and k
    (views), cos / sin ``(P, d)`` read as ``(1, P, d)`` unsqueezed at dim 1; the prefix tokens
    before them joined back unrotated, as the original's ``torch.cat`` does."""
    interleaved = form.interleaved

    def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, **kwargs: Any) -> Any:
        if (as_written(q) or kwargs or not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin))
                or not q.dtype == k.dtype == cos.dtype == sin.dtype or cos.requires_grad or sin.requires_grad
                or q.dim() != 4 or k.dim() != 4 or cos.dim() != 2 or cos.shape != sin.shape
                or not cos.shape[-1] == q.shape[-1] == k.shape[-1] or q.shape[-2] != k.shape[-2]
                or not 0 < cos.shape[0] <= q.shape[-2]):
            return original(q, k, cos, sin, **kwargs)
        prefix = q.shape[-2] - cos.shape[0]
        try:
            qp, kp = rotary_embedding(q[..., prefix:, :], k[..., prefix:, :], cos[None], sin[None], 1, interleaved)
        except (ValueError, TypeError):  # the op's checks refuse (before any kernel runs): the original decides
            return original(q, k, cos, sin, **kwargs)
        if not prefix:
            return qp, kp
        return torch.cat((q[..., :prefix, :], qp), dim=-2), torch.cat((k[..., :prefix, :], kp), dim=-2)

    apply_rotary_pos_emb.original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def _fused_vision(original: Callable[..., Any], form: Form) -> Callable[..., Any]:
    """The vision towers' ``apply_rotary_pos_emb_vision(q, k, cos, sin)``: q, k ``(tokens, heads,
    d)`` and cos / sin ``(tokens, d)`` as the op's ``(1, tokens, heads, d)`` and ``(1, tokens, d)``
    unsqueezed at dim 2, in fp32 as the original computes (q and k taken to fp32, the results cast
    back to their dtypes: the original's casts around one launch in place of its formula)."""
    interleaved = form.interleaved

    def apply_rotary_pos_emb_vision(q: Any, k: Any, cos: Any, sin: Any) -> Any:
        if (as_written(q) or not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin))
                or not all(t.dtype in (torch.float16, torch.bfloat16, torch.float32) for t in (q, k, cos, sin))
                or cos.requires_grad or sin.requires_grad or q.dim() != 3 or k.dim() != 3 or cos.dim() != 2
                or cos.shape != sin.shape or not cos.shape[-1] == q.shape[-1] == k.shape[-1]
                or not cos.shape[0] == q.shape[0] == k.shape[0]):
            return original(q, k, cos, sin)
        f32 = torch.float32
        try:
            qe, ke = rotary_embedding(q[None].to(f32), k[None].to(f32), cos[None].to(f32), sin[None].to(f32), 2,
                                      interleaved)
        except (ValueError, TypeError):  # the op's checks refuse (before any kernel runs): the original decides
            return original(q, k, cos, sin)
        return qe[0].to(q.dtype), ke[0].to(k.dtype)

    apply_rotary_pos_emb_vision.original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb_vision


def _fused_one_tensor(original: Callable[..., Any], form: Form) -> Callable[..., Any]:
    """Gemma 3n's and 4's ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``: Llama's rotation
    of one tensor (q or k, each called on its own), ``x`` as the op's q and an empty slice of it
    along the heads dim as its k."""
    interleaved = form.interleaved

    def apply_rotary_pos_emb(x: Any, cos: Any, sin: Any, unsqueeze_dim: Any = 1) -> Any:
        if (as_written(x) or not all(isinstance(t, torch.Tensor) for t in (x, cos, sin))
                or not x.dtype == cos.dtype == sin.dtype or cos.requires_grad or sin.requires_grad
                or x.dim() != 4 or unsqueeze_dim not in (1, 2) or cos.shape[-1] != x.shape[-1]):
            return original(x, cos, sin, unsqueeze_dim)
        try:
            return rotary_embedding(x, x.narrow(unsqueeze_dim, 0, 0), cos, sin, unsqueeze_dim, interleaved)[0]
        except (ValueError, TypeError):  # the op's checks refuse (before any kernel runs): the original decides
            return original(x, cos, sin, unsqueeze_dim)

    apply_rotary_pos_emb.original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def apply(module: torch.nn.Module) -> None:
    """Give ``module`` its class's forward with ``apply_rotary_pos_emb`` bound to the fused one;
    while torch.compile traces, the class's own forward (Dynamo guards a function's globals as its
    module's, so it is never shown the copy)."""
    cls = type(module)
    fn = cls.forward
    form, _ = _class_form(cls)
    assert form is not None  # fusion_for said so
    scope = dict(fn.__globals__)
    scope[form.name] = fused_rotary(fn.__globals__[form.name], form)
    fused = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    fused.__kwdefaults__ = fn.__kwdefaults__

    @functools.wraps(fn)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return fn(self, *args, **kwargs)
        return fused(self, *args, **kwargs)

    module.forward = types.MethodType(forward, module)
