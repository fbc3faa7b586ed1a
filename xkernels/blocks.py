"""Block fusions for ``xkernels.patch``: a module whose ``forward`` is, statement for statement, one
of the known forwards below gets an equivalent forward that runs fused xkernels ops.

Detection is by the forward's source, not by class name: the source is parsed and compared with
the original it replaces (annotations, docstrings and comments aside). Every transformers family
that copies Llama's decoder layer, BERT's output block or Llama's MLP is found this way (Mistral,
Qwen2/3, Gemma, DeepSeek-V3, Olmo, SmolLM3, ... in transformers 5.23), and a class whose forward
differs in any statement (a residual multiplier, an extra norm) is left as it is. What is fused:

* ``residual add + norm``: ``norm(h + residual)`` as one pass (``add_layer_norm`` /
  ``add_rms_norm``), writing the sum too where the block uses it as its next residual: the
  pre-norm decoder layer (Llama family), BERT's self-output/output, GPT-2's block, ViT's layer;
* ``rms norm``: a Llama- or Gemma-style RMSNorm module (six PyTorch passes) as one kernel;
* ``gated mlp``: ``down(act(gate(x)) * up(x))`` with the two projections and the gate as one op
  (``gated_linear``), also from Phi-3's concatenated ``gate_up_proj``;
* ``residual add in the down projection``: the block's closing ``residual + mlp(h)`` as
  ``linear(..., residual=residual)``, the residual added in the projection's epilogue: in the
  pre-norm decoder layer where its mlp runs the fused gated MLP forward and ``down_proj`` is a
  plain ``nn.Linear`` / ``xkernels.nn.Linear`` (no activation, no hooks); in GPT-2's block where
  the mlp is GPT-2's (``dropout(c_proj(act(c_fc(h))))``), ``c_proj`` a plain ``Conv1D`` and the
  dropout inactive (eval, or p = 0; checked at every call: training with dropout keeps the add
  after it). Under no_grad (inference) the result is written into the residual sum itself,
  which the block made and nothing else holds (one GEMM reading and writing it, also on the
  vendor route: ``addmm_``). The attention's output projection keeps its own forward: its
  residual add is already fused with the norm after it (``add_rms_norm``), and reaching
  ``o_proj`` would mean re-implementing attention.

The fused forward reads the module's parameters at every call (never a copy), so ``.to()``,
loading a state dict and training keep working; dropout runs where the original runs it. The
forward is set on the instance (``module.forward``) and removed by ``PatchReport.undo()``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from xkernels import nn as xnn
from xkernels.ops import add_layer_norm, add_rms_norm, gated_linear, linear
from xkernels.patterns import activation_of, loaded, patterns

# -- the originals, as read in transformers 5.23 ----------------------------------------------------
LLAMA_DECODER_LAYER = '''
def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
            position_embeddings=None, **kwargs):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
        position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache,
        position_embeddings=position_embeddings, **kwargs)
    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    hidden_states = residual + hidden_states
    return hidden_states
'''

BERT_OUTPUT = '''
def forward(self, hidden_states, input_tensor):
    hidden_states = self.dense(hidden_states)
    hidden_states = self.dropout(hidden_states)
    hidden_states = self.LayerNorm(hidden_states + input_tensor)
    return hidden_states
'''

VIT_LAYER = '''
def forward(self, hidden_states, attention_mask=None, **kwargs):
    residual = hidden_states
    hidden_states = self.layernorm_before(hidden_states)
    hidden_states, _ = self.attention(hidden_states, attention_mask, **kwargs)
    hidden_states = self.dropout(hidden_states)
    hidden_states = hidden_states + residual
    residual = hidden_states
    hidden_states = self.layernorm_after(hidden_states)
    hidden_states = self.mlp(hidden_states)
    hidden_states = self.dropout(hidden_states)
    hidden_states = hidden_states + residual
    return hidden_states
'''

GPT2_BLOCK = '''
def forward(self, hidden_states, past_key_values=None, attention_mask=None, encoder_hidden_states=None,
            encoder_attention_mask=None, use_cache=False, **kwargs):
    residual = hidden_states
    hidden_states = self.ln_1(hidden_states)
    attn_output, _ = self.attn(hidden_states, past_key_values=past_key_values, attention_mask=attention_mask,
        use_cache=use_cache, **kwargs)
    hidden_states = attn_output + residual
    if encoder_hidden_states is not None:
        if not hasattr(self, "crossattention"):
            raise ValueError(
                f"If `encoder_hidden_states` are passed, {self} has to be instantiated with "
                "cross-attention layers by setting `config.add_cross_attention=True`"
            )
        residual = hidden_states
        hidden_states = self.ln_cross_attn(hidden_states)
        cross_attn_output, _ = self.crossattention(hidden_states, past_key_values=past_key_values,
            attention_mask=attention_mask, encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask)
        hidden_states = residual + cross_attn_output
    residual = hidden_states
    hidden_states = self.ln_2(hidden_states)
    feed_forward_hidden_states = self.mlp(hidden_states)
    hidden_states = residual + feed_forward_hidden_states
    return hidden_states
'''

GPT2_MLP = '''
def forward(self, hidden_states):
    hidden_states = self.c_fc(hidden_states)
    hidden_states = self.act(hidden_states)
    hidden_states = self.c_proj(hidden_states)
    hidden_states = self.dropout(hidden_states)
    return hidden_states
'''

LLAMA_MLP = '''
def forward(self, x):
    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    return down_proj
'''

PHI3_MLP = '''
def forward(self, hidden_states):
    up_states = self.gate_up_proj(hidden_states)
    gate, up_states = up_states.chunk(2, dim=-1)
    up_states = up_states * self.activation_fn(gate)
    return self.down_proj(up_states)
'''

LLAMA_RMS_NORM = '''
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
'''

GEMMA_RMS_NORM = '''
def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight.float())
    return output.type_as(x)
'''
GEMMA_RMS_NORM_NORM = '''
def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
'''


def canonical(source_or_fn: str | Callable[..., Any]) -> str | None:
    """A function's source reduced to what it does: the AST without annotations, docstring,
    decorators and comments (``None`` where the source cannot be read)."""
    try:
        src = source_or_fn if isinstance(source_or_fn, str) else inspect.getsource(source_or_fn)
        fn = ast.parse(textwrap.dedent(src)).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(fn, ast.FunctionDef):
        return None
    args = fn.args
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    fn.returns, fn.decorator_list, fn.name = None, [], "f"
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        fn.body = body[1:]
    return ast.dump(fn, include_attributes=False)


@cache
def _class_forward(cls: type, method: str = "forward") -> str | None:
    return canonical(getattr(cls, method, None))


# -- norms --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NormKind:
    kind: str  # "layer" | "rms"
    eps_attr: str = "eps"
    offset: float = 0.0


@cache
def norm_kind(cls: type) -> NormKind | None:
    """How a norm module class maps to ``add_layer_norm`` / ``add_rms_norm`` (``None``: unknown)."""
    if cls is torch.nn.LayerNorm:
        return NormKind("layer")
    src = _class_forward(cls)
    if src is not None and src == canonical(LLAMA_RMS_NORM):
        return NormKind("rms", "variance_epsilon")
    if src is not None and src == canonical(GEMMA_RMS_NORM) and _class_forward(cls, "_norm") == canonical(
            GEMMA_RMS_NORM_NORM):
        return NormKind("rms", "eps", 1.0)
    return None


def norm_problem(norm: Any) -> str | None:
    """Why ``norm`` cannot run as a fused norm, or ``None``."""
    if not isinstance(norm, torch.nn.Module):
        return "not a module"
    kind = norm_kind(type(norm))
    if kind is None:
        return f"{type(norm).__name__} is not a LayerNorm or a Llama/Gemma-style RMSNorm"
    if _hooked(norm):
        return f"{type(norm).__name__} has hooks"
    if kind.kind == "layer" and len(norm.normalized_shape) != 1:
        return f"LayerNorm over {tuple(norm.normalized_shape)}: only the last dim is fused"
    if kind.kind == "rms" and not isinstance(getattr(norm, "weight", None), torch.Tensor):
        return f"{type(norm).__name__} has no weight tensor"
    return None


def add_norm(norm: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None, return_sum: bool = True) -> Any:
    """``norm(x + residual)`` in one pass (and the sum, when ``return_sum``)."""
    kind = norm_kind(type(norm))
    eps = getattr(norm, kind.eps_attr)
    if kind.kind == "layer":
        return add_layer_norm(x, residual, norm.weight, norm.bias, eps, return_sum=return_sum)
    return add_rms_norm(x, residual, norm.weight, eps, offset=kind.offset, return_sum=return_sum)


def _hooked(m: torch.nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None))


# -- the fused forwards -------------------------------------------------------------------------------
def _decoder_layer(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None, position_ids: Any = None,
                   past_key_values: Any = None, use_cache: Any = False, position_embeddings: Any = None,
                   **kwargs: Any) -> torch.Tensor:
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, past_key_values=past_key_values,
                                      use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    hidden_states, residual = add_norm(self.post_attention_layernorm, hidden_states, residual)
    return _gated_mlp_plus(self.mlp, hidden_states, residual)


def _bert_output(self: Any, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
    hidden_states = self.dropout(self.dense(hidden_states))
    return add_norm(self.LayerNorm, hidden_states, input_tensor, return_sum=False)


def _vit_layer(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None, **kwargs: Any) -> torch.Tensor:
    residual = hidden_states
    hidden_states = self.layernorm_before(hidden_states)
    hidden_states, _ = self.attention(hidden_states, attention_mask, **kwargs)
    hidden_states, residual = add_norm(self.layernorm_after, self.dropout(hidden_states), residual)
    hidden_states = self.dropout(self.mlp(hidden_states))
    return hidden_states + residual


def _gpt2_block(self: Any, hidden_states: torch.Tensor, past_key_values: Any = None, attention_mask: Any = None,
                encoder_hidden_states: Any = None, encoder_attention_mask: Any = None, use_cache: Any = False,
                **kwargs: Any) -> torch.Tensor:
    if encoder_hidden_states is not None:  # cross-attention sits between the add and ln_2: the original runs
        return type(self).forward(self, hidden_states, past_key_values, attention_mask, encoder_hidden_states,
                                  encoder_attention_mask, use_cache, **kwargs)
    residual = hidden_states
    hidden_states = self.ln_1(hidden_states)
    attn_output, _ = self.attn(hidden_states, past_key_values=past_key_values, attention_mask=attention_mask,
                               use_cache=use_cache, **kwargs)
    hidden_states, residual = add_norm(self.ln_2, attn_output, residual)
    return _gpt2_mlp_plus(self.mlp, hidden_states, residual)


def _rms_norm(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return add_norm(self, hidden_states, None, return_sum=False)


def _llama_gated(self: Any, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_proj, self.up_proj
    return gated_linear(x, gate.weight, up.weight, gate.bias, up.bias, self._xkernels_activation)


def _phi3_gated(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    gate_up = self.gate_up_proj
    return gated_linear(hidden_states, gate_up.weight, None, gate_up.bias, None, self._xkernels_activation)


def _llama_mlp(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(_llama_gated(self, x))


def _phi3_mlp(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return self.down_proj(_phi3_gated(self, hidden_states))


#: the fused gated-MLP forwards and the part of each before the down projection
_GATED_PART = {_llama_mlp: _llama_gated, _phi3_mlp: _phi3_gated}


# -- the residual add in the down projection's epilogue -------------------------------------------------
def _plain_projection(m: Any) -> bool:
    """A projection computing ``F.linear(x, m.weight, m.bias)`` alone: ``nn.Linear``, or
    ``xkernels.nn.Linear`` without an activation; no hooks."""
    return ((type(m) is torch.nn.Linear or type(m) is xnn.Linear and m.activation is None)
            and not _hooked(m))


def _plain_conv1d(m: Any) -> bool:
    """transformers' ``Conv1D`` (``x @ weight + bias``, weight (in, out)) or ``xkernels.nn.Conv1D``
    without an activation; no hooks."""
    conv1d = tuple(cls for cls, _ in loaded(patterns()["conv1d"]))
    return ((type(m) in conv1d or type(m) is xnn.Conv1D and m.activation is None) and not _hooked(m)
            and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2)


_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def _plus(x: torch.Tensor, weight: torch.Tensor, bias: Any, residual: torch.Tensor) -> torch.Tensor:
    """``residual + F.linear(x, weight, bias)`` as one ``linear``. ``residual`` is a sum the block
    made (``add_norm``'s): where nothing can need it afterwards (no gradient recorded, not
    tracing) the result is written into it."""
    in_place = (not (torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                     for t in (x, weight, bias, residual)))
                and not _is_compiling()
                and torch.promote_types(x.dtype, residual.dtype) == residual.dtype
                and residual.shape == (*x.shape[:-1], weight.shape[0]))
    if in_place:
        return linear(x, weight, bias, residual=residual, out=residual)
    return linear(x, weight, bias, residual=residual)


def _gated_down(mlp: Any) -> Any:
    """``mlp``'s down projection where ``mlp`` runs a fused gated-MLP forward (or will, once
    patched) and its ``down_proj`` is plain: the residual can be added in its epilogue."""
    if not isinstance(mlp, torch.nn.Module) or _hooked(mlp):
        return None
    down = getattr(mlp, "down_proj", None)
    return down if _plain_projection(down) else None


def _gated_mlp_plus(mlp: Any, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + mlp(h)``, the residual added in the down projection's epilogue where
    ``mlp`` runs the fused gated MLP forward and its down projection is plain."""
    gated = _GATED_PART.get(getattr(mlp.__dict__.get("forward"), "__func__", None))
    down = _gated_down(mlp) if gated is not None else None
    if down is None:
        return residual + mlp(h)
    return _plus(gated(mlp, h), down.weight, down.bias, residual)


def _gpt2_mlp_ok(mlp: Any) -> bool:
    """Whether ``mlp`` is GPT-2's MLP (by its forward) with a plain ``c_proj`` and no hooks."""
    return (isinstance(mlp, torch.nn.Module) and _class_forward(type(mlp)) == canonical(GPT2_MLP)
            and "forward" not in mlp.__dict__ and not _hooked(mlp) and _plain_conv1d(getattr(mlp, "c_proj", None))
            and type(getattr(mlp, "dropout", None)) is torch.nn.Dropout and not _hooked(mlp.dropout))


def _gpt2_mlp_plus(mlp: Any, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + mlp(h)``; GPT-2's MLP with its dropout inactive (eval, or p = 0) adds the
    residual in ``c_proj``'s epilogue, after ``act(c_fc(h))`` (their own modules, fused or not)."""
    if not _gpt2_mlp_ok(mlp) or (mlp.dropout.training and mlp.dropout.p > 0):
        return residual + mlp(h)
    proj = mlp.c_proj
    return _plus(mlp.act(mlp.c_fc(h)), proj.weight.t(), proj.bias, residual)


def describe(module: torch.nn.Module, fusion: BlockFusion) -> str:
    """The fusion's name for ``module``, with the residual add in the down projection where the
    block will make it (the report's line)."""
    if fusion.forward is _decoder_layer:
        mlp = getattr(module, "mlp", None)
        found = fusion_for(mlp) if isinstance(mlp, torch.nn.Module) else (None, None)
        gated = (found[0] is not None and found[0].forward in _GATED_PART and found[1] is None
                 or getattr(mlp.__dict__.get("forward") if mlp is not None else None, "__func__", None) in _GATED_PART)
        if gated and _gated_down(mlp) is not None:
            return fusion.name + " + residual add in mlp.down_proj"
    if fusion.forward is _gpt2_block and _gpt2_mlp_ok(getattr(module, "mlp", None)):
        return fusion.name + " + residual add in mlp.c_proj (while dropout is inactive)"
    return fusion.name


# -- when each applies --------------------------------------------------------------------------------
def _norms(*names: str) -> Callable[[torch.nn.Module], str | None]:
    def problem(m: torch.nn.Module) -> str | None:
        for name in names:
            why = norm_problem(getattr(m, name, None))
            if why:
                return f"{name}: {why}"
        return None
    return problem


def _plain_linear(m: Any) -> bool:
    return type(m) is torch.nn.Linear and not _hooked(m)


def _gate_activation(act: Any) -> str | None:
    found = activation_of(act) if isinstance(act, torch.nn.Module) else "not a module"
    if isinstance(found, str) or found[0] not in ("relu", "gelu", "gelu_tanh", "silu") or _hooked(act):
        return None
    return found[0]


def _gated_problem(proj: tuple[str, ...], act: str) -> Callable[[torch.nn.Module], str | None]:
    def problem(m: torch.nn.Module) -> str | None:
        for name in proj:
            if not _plain_linear(getattr(m, name, None)):
                return f"{name} is not a plain torch.nn.Linear without hooks"
        if _gate_activation(getattr(m, act, None)) is None:
            return f"{act} ({type(getattr(m, act, None)).__name__}) is not relu/gelu/gelu_tanh/silu"
        if len(proj) == 2 and getattr(m, proj[0]).weight.shape != getattr(m, proj[1]).weight.shape:
            return f"{proj[0]} and {proj[1]} have different shapes"
        if len(proj) == 1 and getattr(m, proj[0]).weight.shape[0] % 2:
            return f"{proj[0]} has an odd number of outputs"
        return None
    return problem


@dataclass(frozen=True)
class BlockFusion:
    """One known forward and its fused replacement."""

    name: str  # reported: what is fused
    original: str  # the forward it replaces
    forward: Callable[..., Any]
    problem: Callable[[torch.nn.Module], str | None]  # why a matching module cannot take it
    activation: str | None = None  # the attribute whose activation the fused op applies
    consumed: tuple[str, ...] = ()  # child modules the fused forward no longer calls


FUSIONS = (
    BlockFusion("residual add + norm (pre-norm decoder layer)", LLAMA_DECODER_LAYER, _decoder_layer,
                _norms("post_attention_layernorm")),
    BlockFusion("residual add + norm (output block)", BERT_OUTPUT, _bert_output, _norms("LayerNorm")),
    BlockFusion("residual add + norm (ViT layer)", VIT_LAYER, _vit_layer, _norms("layernorm_after")),
    BlockFusion("residual add + norm (GPT-2 block)", GPT2_BLOCK, _gpt2_block, _norms("ln_2")),
    BlockFusion("gated mlp", LLAMA_MLP, _llama_mlp, _gated_problem(("gate_proj", "up_proj"), "act_fn"), "act_fn",
                ("gate_proj", "up_proj", "act_fn")),
    BlockFusion("gated mlp (gate_up)", PHI3_MLP, _phi3_mlp, _gated_problem(("gate_up_proj",), "activation_fn"),
                "activation_fn", ("gate_up_proj", "activation_fn")),
    BlockFusion("rms norm", LLAMA_RMS_NORM, _rms_norm, lambda m: norm_problem(m)),
)


@cache
def _fusion_for(cls: type) -> BlockFusion | None:
    src = _class_forward(cls)
    if src is None:
        return None
    for f in FUSIONS:
        if src == canonical(f.original):
            return f
    if norm_kind(cls) is not None and norm_kind(cls).kind == "rms":  # Gemma-style RMSNorm
        return FUSIONS[-1]
    return None


def fusion_for(module: torch.nn.Module) -> tuple[BlockFusion | None, str | None]:
    """``(fusion, None)`` where ``module`` can take one, ``(fusion, why not)`` where its forward
    matches but it cannot, ``(None, None)`` where its forward is none of the known ones."""
    fusion = _fusion_for(type(module))
    if fusion is None:
        return None, None
    if _hooked(module):
        return fusion, "the module has hooks"
    if "forward" in module.__dict__:
        return fusion, "its forward is already replaced on the instance"
    return fusion, fusion.problem(module)


def apply(module: torch.nn.Module, fusion: BlockFusion) -> None:
    """Give ``module`` the fused forward (undo: ``restore``)."""
    if fusion.activation is not None:
        module._xkernels_activation = _gate_activation(getattr(module, fusion.activation))
    module.forward = types.MethodType(fusion.forward, module)


def restore(module: torch.nn.Module) -> None:
    """The module's own forward again."""
    module.__dict__.pop("forward", None)
    module.__dict__.pop("_xkernels_activation", None)
