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
  and in any other forward, each ``self.<norm>(a + b)`` and ``h = a + b; h = self.<norm>(h)``
  (``residual add + norm (post-norm)``: ``xkernels/add_norm_forms.py`` rewrites the forward's
  source; BART and its copies, DistilBERT, GTE, wav2vec2, DETR, ... and BERT's embeddings) and
  each ``s = a + b`` whose sum is kept as the next residual before ``self.<norm>(s)``
  (``residual add + norm (pre-norm)``: Whisper, mBART, Pegasus, M2M-100, BioGPT, ...), fused
  per call where the two operands share a shape and dtype;
* ``rms norm``: a Llama-, Helium- (Flint-) or Gemma-style RMSNorm module (six PyTorch passes) as
  one kernel, the weightless one of NanoChat and HRM (the op's ``weight=None``), or T5's where
  the input and the weight share a dtype (T5, mT5, UMT5, LongT5, Pix2Struct, ...);
* ``gated mlp``: ``act(gate(x)) * up(x)`` with the two projections and the gate as one op
  (``gated_linear``), then what the forward applies to the product (the down-projection, dropouts,
  a norm, T5's cast), whatever the children are named and however the source is written
  (``xkernels/gated_forms.py``: Llama's family, the VLM vision towers, Llama 4, T5 v1.1 and mT5,
  GTE, T5Gemma, Seed-OSS, BitNet, ...); ``gated mlp (gate_up)``: the same from one projection
  whose output is chunked in two halves, either half gated (Phi-3, GLM-4, ModernBERT, Granite's
  shared MLP, Dia, ...);
* ``feed-forward (training)``: ``down(act(up(x)))`` (any module whose forward only applies three
  children to its input in turn, :func:`mlp_chain`, the first and last ``nn.Linear`` and the
  middle an activation: ViT's, DINOv2's, SigLIP's, GPT-NeoX's, Falcon's MLPs, whatever the names;
  or four, the fourth an ``nn.Dropout`` applied after the block: GPT-J's, CodeGen's, GPT-Neo's;
  BERT's ``feed_forward_chunk`` over its intermediate and output blocks) as one
  autograd block where a gradient is required (``ops/matmul/feed_forward.py``: the backward
  applies the activation's derivative inside the down-projection's input-gradient GEMM). Without
  a gradient the module's own forward runs, through the fused ``xkernels.nn.Linear`` layers;
* ``experts gate``: a mixture-of-experts module's ``_apply_gate`` (transformers'
  ``@use_experts_implementation`` default: ``act_fn(gate) * up`` of the chunked gate_up result of
  every routed token) as one pass each way (``ops/fused/gated_activation.py``): Mixtral, Qwen2/3-MoE,
  DeepSeek-V3, OLMoE, GLM-4-MoE, ... under transformers' ``grouped_mm`` (its default) and
  ``batched_mm`` experts implementations; its ``eager`` loop computes the gate inline;
* ``experts gate (clamped)``: GPT-OSS's clamped gate on interleaved gate_up columns (its eager
  loop calls ``_apply_gate`` too), the chunked copies of OpenAI's privacy filter and
  MiniMax-M3-VL, the SiLU of the clamped gate of DeepSeek-V4, GLM-5-Next and HY-V4
  (``clamped_gated_activation``; the limit and alpha read from the module at every call).
  Both gates' originals, records and fused methods: ``xkernels/experts_gates.py``. Either fusion
  also sets the module's forward to transformers' ``grouped_mm`` experts forward with the
  routing passes around the grouped GEMMs fused, where its class forward is
  ``@use_experts_implementation``'s (``experts routing`` in the report; per call, only under
  ``grouped_mm``: ``xkernels/experts_forward.py``).

What a fusion fixes (the norm's kind, eps attribute and offset; the projections and activation)
is resolved by ``apply`` into a frozen record on the module, ``module._xkernels_block``
(``xkernels/block_steps.py``: the per-call steps). The fused forward reads the module's children
and parameters at every call (never a copy), so ``.to()``, loading a state dict and training keep
working; dropout runs where the original runs it. An activation recorded this way is checked per
call against the kind of module in its slot (``activation_kind``): another one put there after
``patch()`` makes the class's own forward (or gate) run. The forward is set on the instance
(``module.forward``, bound to it: a deep copy computes with its own parameters) and removed with
the record by ``PatchReport.undo()``.
"""

from __future__ import annotations

import ast
import functools
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from xkernels.add_norm_forms import add_norm_form
from xkernels.block_steps import (
    FUSED_NORM_DTYPES,
    AddNormSteps,
    FeedForwardStep,
    NormStep,
    activation_kind,
    add_norm_and_sum,
    add_then_norm,
    as_written,
    checkpointed,
    child_at,
    fusable_dropout,
    gated_step,
    hooked,
    norm_block_as_written,
    norm_step,
    own_forward,
)
from xkernels.experts_forward import experts_interface, routed_forward
from xkernels.experts_gates import (
    CLAMPED_GATES,
    EXPERTS_APPLY_GATE,
    EXPERTS_FP32_APPLY_GATE,
    ClampedGateForm,
    ExpertsGate,
    clamped_gate_problem,
    experts_clamped_gate,
    experts_gate,
    experts_gate_problem,
    gate_activation,
)
from xkernels.gated_forms import GatedForm, gated_form
from xkernels.linear_forms import computes_linear
from xkernels.ops import add_layer_norm, add_rms_norm
from xkernels.ops.op import _capturing, _grad_enabled, _is_compiling
from xkernels.patterns import activation_of
from xkernels.source_forms import canonical, function_node, without_docstring

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

BERT_FEED_FORWARD_CHUNK = '''
def feed_forward_chunk(self, attention_output):
    intermediate_output = self.intermediate(attention_output)
    layer_output = self.output(intermediate_output, attention_output)
    return layer_output
'''
BERT_INTERMEDIATE = '''
def forward(self, hidden_states):
    hidden_states = self.dense(hidden_states)
    hidden_states = self.intermediate_act_fn(hidden_states)
    return hidden_states
'''

LLAMA_RMS_NORM = '''
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
'''

#: Helium's (and others'): the weight applied in fp32, one rounding at the end (the op's own math)
HELIUM_RMS_NORM = '''
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return (self.weight.to(torch.float32) * hidden_states).to(input_dtype)
'''

#: Flint's (and others'): the model-dtype weight times the fp32 normalized values (promoted to fp32:
#: the product is Helium's), one rounding at the end
FLINT_RMS_NORM = '''
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return (self.weight * hidden_states).to(input_dtype)
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


#: NanoChat's and HRM's: no weight, normalized in fp32 (``_norm`` is Gemma's), cast back
WEIGHTLESS_RMS_NORM = '''
def forward(self, x):
    return self._norm(x.float()).type_as(x)
'''

#: T5's (mT5, UMT5, LongT5, Pix2Struct, Idefics, ...): x times the fp32 reciprocal, cast to a half
#: weight's dtype. Where x and the weight share a dtype this is Llama's math; else it keeps its own
T5_LAYER_NORM = '''
def forward(self, hidden_states):
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states
'''


@cache
def _class_forward(cls: type, method: str = "forward") -> str | None:
    return canonical(getattr(cls, method, None))


# -- norms --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NormKind:
    kind: str  # "layer" | "rms"
    eps_attr: str = "eps"
    offset: float = 0.0
    weighted: bool = True  # an RMSNorm without a weight (NanoChat's): the op's weight=None
    #: T5's: the op's math only where the input and the weight share a dtype (fp32, fp16, bf16),
    #: checked per call; fused on its own, never as a block's child norm
    same_dtype: bool = False


@cache
def norm_kind(cls: type) -> NormKind | None:
    """How a norm module class maps to ``add_layer_norm`` / ``add_rms_norm`` (``None``: unknown)."""
    if cls is torch.nn.LayerNorm:
        return NormKind("layer")
    src = _class_forward(cls)
    if src is None:
        return None
    if src in (canonical(LLAMA_RMS_NORM), canonical(HELIUM_RMS_NORM), canonical(FLINT_RMS_NORM)):
        return NormKind("rms", "variance_epsilon")
    if src in (canonical(GEMMA_RMS_NORM), canonical(WEIGHTLESS_RMS_NORM)) and _class_forward(
            cls, "_norm") == canonical(GEMMA_RMS_NORM_NORM):
        return NormKind("rms", "eps", 1.0) if src == canonical(GEMMA_RMS_NORM) else NormKind("rms", weighted=False)
    if src == canonical(T5_LAYER_NORM):
        return NormKind("rms", "variance_epsilon", same_dtype=True)
    return None


def norm_problem(norm: Any) -> str | None:
    """Why ``norm`` cannot run as a fused norm, or ``None``."""
    if not isinstance(norm, torch.nn.Module):
        return "not a module"
    kind = norm_kind(type(norm))
    if kind is None:
        return f"{type(norm).__name__} is not a LayerNorm or a Llama/Helium/Gemma/NanoChat-style RMSNorm"
    if hooked(norm):
        return f"{type(norm).__name__} has hooks"
    if kind.kind == "layer" and len(norm.normalized_shape) != 1:
        return f"LayerNorm over {tuple(norm.normalized_shape)}: only the last dim is fused"
    if kind.kind == "rms" and kind.weighted and not isinstance(getattr(norm, "weight", None), torch.Tensor):
        return f"{type(norm).__name__} has no weight tensor"
    return None


def add_norm(norm: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None, return_sum: bool = True) -> Any:
    """``norm(x + residual)`` in one pass (and the sum, when ``return_sum``)."""
    kind = norm_kind(type(norm))
    eps = getattr(norm, kind.eps_attr)
    if kind.kind == "layer":
        return add_layer_norm(x, residual, norm.weight, norm.bias, eps, return_sum=return_sum)
    weight = norm.weight if kind.weighted else None
    return add_rms_norm(x, residual, weight, eps, offset=kind.offset, return_sum=return_sum)


# -- the fused forwards: children read from ``_modules`` (no ``nn.Module.__getattr__`` frame) ------
# While torch.compile traces an inference call, each runs its class's own forward: the compiler fuses
# the adds, norms and gates itself, and the fused ops' custom-op nodes measured 0.89x (Llama training)
# and 0.97x (BERT training) of torch.compile on the unpatched model on an H100
# (results/2026-11-24-h100-model-modes). A training call traces the fused forward, whose add + norm
# step launches its kernels as user-defined Triton kernels where a table rule measured that faster
# than the compiler's and no dropout of the block is active but BERT's output blocks' own, which
# the kernels then apply (block_steps.norm_block_as_written).
# A call whose input's backend runs no kernels runs its class's own forward too (the cpu backend).
# Under autocast they run fused: each add + norm step takes the fused op only where the class's own
# norm would compute the same in fp32 (block_steps.same_math), and a gated MLP's training call casts
# its GEMM operands first.
def _decoder_layer(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None, position_ids: Any = None,
                   past_key_values: Any = None, use_cache: Any = False, position_embeddings: Any = None,
                   **kwargs: Any) -> torch.Tensor:
    if norm_block_as_written(hidden_states, self):  # see the note above
        return own_forward(type(self))(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_values=past_key_values, use_cache=use_cache,
                                  position_embeddings=position_embeddings, **kwargs)
    m = self._modules
    residual = hidden_states
    hidden_states = m["input_layernorm"](hidden_states)
    hidden_states, _ = m["self_attn"](hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, past_key_values=past_key_values,
                                      use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    hidden_states, residual = self._xkernels_block(self, hidden_states, residual)
    return residual + m["mlp"](hidden_states)


def _bert_output(self: Any, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
    if norm_block_as_written(hidden_states, self, "dropout"):  # see the note above
        return own_forward(type(self))(self, hidden_states, input_tensor)
    m = self._modules
    dropout = m["dropout"]
    if _is_compiling() and fusable_dropout(dropout):  # a training call: the dropout in the form's kernels where it can
        return self._xkernels_block.dropped(self, m["dense"](hidden_states), input_tensor, dropout)
    return self._xkernels_block(self, dropout(m["dense"](hidden_states)), input_tensor)


def _vit_layer(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None, **kwargs: Any) -> torch.Tensor:
    if norm_block_as_written(hidden_states, self):  # see the note above
        return own_forward(type(self))(self, hidden_states, attention_mask, **kwargs)
    m = self._modules
    residual = hidden_states
    hidden_states = m["layernorm_before"](hidden_states)
    hidden_states, _ = m["attention"](hidden_states, attention_mask, **kwargs)
    dropout = m["dropout"]
    hidden_states, residual = self._xkernels_block(self, dropout(hidden_states), residual)
    return dropout(m["mlp"](hidden_states)) + residual


def _gpt2_block(self: Any, hidden_states: torch.Tensor, past_key_values: Any = None, attention_mask: Any = None,
                encoder_hidden_states: Any = None, encoder_attention_mask: Any = None, use_cache: Any = False,
                **kwargs: Any) -> torch.Tensor:
    # cross-attention: between the add and ln_2
    if encoder_hidden_states is not None or norm_block_as_written(hidden_states, self):
        return own_forward(type(self))(self, hidden_states, past_key_values, attention_mask, encoder_hidden_states,
                                  encoder_attention_mask, use_cache, **kwargs)
    m = self._modules
    residual = hidden_states
    hidden_states = m["ln_1"](hidden_states)
    attn_output, _ = m["attn"](hidden_states, past_key_values=past_key_values, attention_mask=attention_mask,
                               use_cache=use_cache, **kwargs)
    hidden_states, residual = self._xkernels_block(self, attn_output, residual)
    return residual + m["mlp"](hidden_states)


def _rms_norm(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    if as_written(hidden_states):  # see the note above
        return own_forward(type(self))(self, hidden_states)
    return self._xkernels_block(self, hidden_states, None)


def _rms_norm_same_dtype(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    w = self._parameters.get("weight")
    if (as_written(hidden_states) or w is None or hidden_states.dtype is not w.dtype
            or w.dtype not in FUSED_NORM_DTYPES):  # the class's own math differs from the op's there
        return own_forward(type(self))(self, hidden_states)
    return self._xkernels_block(self, hidden_states, None)


def _gated_mlp(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    # one positional input; a call naming it (its name differs between the forms) runs the class's own
    if kwargs or len(args) != 1 or as_written(args[0]):  # see the note above
        if _is_compiling() and not kwargs and len(args) == 1:  # the fused kernel where its table says it pays
            y = self._xkernels_block.compiled(self, args[0])
            if y is not None:
                return y
        return own_forward(type(self))(self, *args, **kwargs)
    step = self._xkernels_block
    gated = step(self, args[0])
    if gated is None:  # a projection replaced since patch(): the class's own forward
        return own_forward(type(self))(self, *args)
    return step.finish(self, gated)


def _two_layer_mlp(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    step = self._xkernels_block
    y = step(self, hidden_states)  # None: no gradient, compiling, or no fused plan
    if y is None:
        return own_forward(type(self))(self, hidden_states)
    return child_at(self, step.after)(y) if step.after else y  # the forward's trailing dropout


def _bert_feed_forward(self: Any, attention_output: torch.Tensor) -> torch.Tensor:
    y = self._xkernels_block(self, attention_output)
    if y is None:
        return type(self).feed_forward_chunk(self, attention_output)
    out = self._modules["output"]  # BERT_OUTPUT's remaining steps: dropout, then norm(y + input)
    y = out._modules["dropout"](y)
    step = out.__dict__.get("_xkernels_block")
    if step is not None and "forward" in out.__dict__:  # its fusion: add + norm in one pass
        return step(out, y, attention_output)
    return out._modules["LayerNorm"](y + attention_output)


# -- when each applies --------------------------------------------------------------------------------
def _norm_step(module: torch.nn.Module, name: str | None, return_sum: bool) -> NormStep:
    """The record of ``module``'s add + norm step (its norm: the child ``name``, or itself)."""
    norm = module if name is None else getattr(module, name)
    kind = norm_kind(type(norm))
    assert kind is not None  # the fusion's ``problem`` checked it
    return norm_step(name, type(norm), kind.kind == "layer", kind.eps_attr, kind.offset, return_sum, add_norm,
                     kind.weighted)


def _site_norm_problem(m: torch.nn.Module, name: str) -> str | None:
    norm = getattr(m, name, None)
    why = norm_problem(norm)
    if why is None and norm_kind(type(norm)).same_dtype:
        why = f"{type(norm).__name__} (T5's RMSNorm) is fused on its own only"
    return why


def _norms(*names: str) -> Callable[[torch.nn.Module], str | None]:
    def problem(m: torch.nn.Module) -> str | None:
        for name in names:
            why = _site_norm_problem(m, name)
            if why:
                return f"{name}: {why}"
        return None
    return problem


def _plain_linear(m: Any) -> bool:
    return (type(m) is torch.nn.Linear or computes_linear(type(m))) and not hooked(m)


def _gated_problem(proj: tuple[str, ...], act: str) -> Callable[[torch.nn.Module], str | None]:
    def problem(m: torch.nn.Module) -> str | None:
        for name in proj:
            if not _plain_linear(getattr(m, name, None)):
                return f"{name} is not a plain torch.nn.Linear (or a subclass computing F.linear) without hooks"
        if gate_activation(getattr(m, act, None)) is None:
            return f"{act} ({type(getattr(m, act, None)).__name__}) is not an activation xkernels.ops.gated_linear takes"
        if len(proj) == 2 and getattr(m, proj[0]).weight.shape != getattr(m, proj[1]).weight.shape:
            return f"{proj[0]} and {proj[1]} have different shapes"
        if len(proj) == 1 and getattr(m, proj[0]).weight.shape[0] % 2:
            return f"{proj[0]} has an odd number of outputs"
        return None
    return problem


def _linear_activation(act: Any) -> str | None:
    """The name of ``act``'s activation where ``xkernels.ops.linear`` fuses it, else ``None``."""
    from xkernels.nn import linear_activations

    found = activation_of(act) if isinstance(act, torch.nn.Module) else "not a module"
    if isinstance(found, str) or found[0] not in linear_activations() or hooked(act):
        return None
    return found[0]


def _mlp_problem(up: str, act: str, down: str) -> Callable[[torch.nn.Module], str | None]:
    def problem(m: torch.nn.Module) -> str | None:
        for name in (up, down):
            if not _plain_linear(getattr(m, name, None)):
                return f"{name} is not a plain torch.nn.Linear (or a subclass computing F.linear) without hooks"
        if _linear_activation(getattr(m, act, None)) is None:
            return f"{act} ({type(getattr(m, act, None)).__name__}) is not an activation xkernels.ops.linear fuses"
        return None
    return problem


def _bert_chunk_problem(m: torch.nn.Module) -> str | None:
    inter, out = getattr(m, "intermediate", None), getattr(m, "output", None)
    if not isinstance(inter, torch.nn.Module) or _class_forward(type(inter)) != canonical(BERT_INTERMEDIATE):
        return "intermediate is not BERT's dense + activation block"
    if not isinstance(out, torch.nn.Module) or _class_forward(type(out)) != canonical(BERT_OUTPUT):
        return "output is not BERT's output block"
    if hooked(inter) or hooked(out):
        return "intermediate or output has hooks"
    if not _plain_linear(getattr(inter, "dense", None)) or not _plain_linear(getattr(out, "dense", None)):
        return "a dense layer is not a plain torch.nn.Linear without hooks"
    act = getattr(inter, "intermediate_act_fn", None)
    if _linear_activation(act) is None:
        return f"intermediate_act_fn ({type(act).__name__}) is not an activation xkernels.ops.linear fuses"
    return None


@dataclass(frozen=True)
class BlockFusion:
    """One known forward and its fused replacement."""

    name: str  # reported: what is fused
    original: str  # the forward it replaces
    forward: Callable[..., Any]
    problem: Callable[[torch.nn.Module], str | None]  # why a matching module cannot take it
    activation: str | None = None  # the attribute whose activation the fused op applies
    consumed: tuple[str, ...] = ()  # child modules the fused forward no longer calls
    norm: str | None = None  # the child norm of an add + norm fusion
    return_sum: bool = True  # whether its forward uses the sum (the next residual)
    norm_itself: bool = False  # the module is the norm (the rms norm fusion)
    method: str = "forward"  # the method the original is and the fused one replaces
    feed_forward: FeedForwardStep | None = None  # the training block's children (feed-forward fusions)
    candidate: Callable[[torch.nn.Module], bool] | None = None  # False: not this fusion's kind of module
    gated: GatedForm | None = None  # a gated MLP's children and what follows the product (gated_forms)
    add_norms: tuple[str, ...] = ()  # the norm children of a rewritten forward's post-norm sites (add_norm_forms)
    add_norms_summed: tuple[str, ...] = ()  # ... and of its pre-norm sites (the sum kept)
    clamped: ClampedGateForm | None = None  # a clamped experts' gate: where its numbers are


FUSIONS = (
    BlockFusion("residual add + norm (pre-norm decoder layer)", LLAMA_DECODER_LAYER, _decoder_layer,
                _norms("post_attention_layernorm"), norm="post_attention_layernorm"),
    BlockFusion("residual add + norm (output block)", BERT_OUTPUT, _bert_output, _norms("LayerNorm"),
                norm="LayerNorm", return_sum=False),
    BlockFusion("residual add + norm (ViT layer)", VIT_LAYER, _vit_layer, _norms("layernorm_after"),
                norm="layernorm_after"),
    BlockFusion("residual add + norm (GPT-2 block)", GPT2_BLOCK, _gpt2_block, _norms("ln_2"), norm="ln_2"),
    BlockFusion("feed-forward (training)", BERT_FEED_FORWARD_CHUNK, _bert_feed_forward, _bert_chunk_problem,
                method="feed_forward_chunk",
                feed_forward=FeedForwardStep(("intermediate", "dense"), ("intermediate", "intermediate_act_fn"),
                                             ("output", "dense"))),
    BlockFusion("experts gate", EXPERTS_APPLY_GATE, experts_gate, experts_gate_problem, method="_apply_gate",
                candidate=lambda m: getattr(m, "has_gate", True) is not False),  # NemotronH's: no gate to apply
    BlockFusion("experts gate", EXPERTS_FP32_APPLY_GATE, experts_gate, experts_gate_problem, method="_apply_gate"),
    *(BlockFusion("experts gate (clamped)", src, experts_clamped_gate, clamped_gate_problem(form),
                  method="_apply_gate", clamped=form) for src, form in CLAMPED_GATES),
    BlockFusion("rms norm", LLAMA_RMS_NORM, _rms_norm, lambda m: norm_problem(m), return_sum=False,
                norm_itself=True),
)
#: T5's RMSNorm: the op where the input and the weight share a dtype, else its own forward (per call)
_RMS_NORM_SAME_DTYPE = BlockFusion("rms norm", T5_LAYER_NORM, _rms_norm_same_dtype, lambda m: norm_problem(m),
                                   return_sum=False, norm_itself=True)
#: the methods a fusion may replace on an instance
METHODS = tuple(sorted({f.method for f in FUSIONS}))


@cache
def mlp_chain(cls: type) -> tuple[str, ...] | None:
    """The child modules ``cls.forward`` applies to its one input, in order, where that is all it
    does: ``x = self.a(x); x = self.b(x); return self.c(x)``, nested calls (``self.b(self.a(x))``)
    or any mix, any names; ``None`` for any other forward (another argument, a keyword, a second
    use of an earlier value, any other statement)."""
    fn = function_node(getattr(cls, "forward", None))
    if fn is None:
        return None
    a = fn.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults or len(a.args) != 2:
        return None
    body = without_docstring(fn.body)
    live = a.args[1].arg  # the one name holding the chain's value

    def applied(e: ast.expr) -> list[str] | None:
        if isinstance(e, ast.Name) and e.id == live:
            return []
        if (isinstance(e, ast.Call) and not e.keywords and len(e.args) == 1 and isinstance(e.func, ast.Attribute)
                and isinstance(e.func.value, ast.Name) and e.func.value.id == "self"):
            inner = applied(e.args[0])
            return None if inner is None else [*inner, e.func.attr]
        return None

    chain: list[str] = []
    for st in body[:-1]:
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)):
            return None
        seq = applied(st.value)
        if not seq:
            return None
        chain += seq
        live = st.targets[0].id
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    seq = applied(body[-1].value)
    return None if seq is None else tuple(chain + seq)


def _looks_like_mlp(up: str, act: str, down: str, after: str | None) -> Callable[[torch.nn.Module], bool]:
    """Whether a module whose forward is the chain (up, act, down[, after]) is a feed-forward block
    at all: linear layers around an activation module, and ``after`` (if any) an ``nn.Dropout``
    (anything else, e.g. convolutions around a norm, is not a candidate and not reported)."""
    def candidate(m: torch.nn.Module) -> bool:
        u, f, d = (getattr(m, n, None) for n in (up, act, down))
        return (isinstance(u, torch.nn.Linear) and isinstance(d, torch.nn.Linear) and isinstance(f, torch.nn.Module)
                and not isinstance(activation_of(f), str)
                and (after is None or type(getattr(m, after, None)) is torch.nn.Dropout))
    return candidate


@cache
def _chain_fusion(chain: tuple[str, ...]) -> BlockFusion:
    up, act, down, *rest = chain
    after = rest[0] if rest else None
    return BlockFusion("feed-forward (training)", "", _two_layer_mlp, _mlp_problem(up, act, down),
                       feed_forward=FeedForwardStep((up,), (act,), (down,), (after,) if after else ()),
                       candidate=_looks_like_mlp(up, act, down, after))


def _looks_gated(form: GatedForm) -> Callable[[torch.nn.Module], bool]:
    """Whether a module whose forward is ``form`` is a gated MLP at all: its projections linear
    layers and its activation a module (else not a candidate, not reported). An activation the op
    does not take (a Softplus, say) makes it a candidate left with that reason."""
    def candidate(m: torch.nn.Module) -> bool:
        return (all(isinstance(getattr(m, n, None), torch.nn.Linear) for n in form.proj)
                and isinstance(getattr(m, form.act, None), torch.nn.Module))
    return candidate


@cache
def _gated_fusion(form: GatedForm) -> BlockFusion:
    return BlockFusion("gated mlp" if len(form.proj) == 2 else "gated mlp (gate_up)", "", _gated_mlp,
                       _gated_problem(form.proj, form.act), form.act, (*form.proj, form.act),
                       candidate=_looks_gated(form), gated=form)


def _add_norm_problem(norms: tuple[str, ...]) -> Callable[[torch.nn.Module], str | None]:
    """None where at least one site's norm takes the fused op (the others run as written)."""
    def problem(m: torch.nn.Module) -> str | None:
        whys = [f"{n}: {why}" for n in norms if (why := _site_norm_problem(m, n))]
        return "; ".join(whys) if len(whys) == len(norms) else None
    return problem


def _has_a_norm(norms: tuple[str, ...]) -> Callable[[torch.nn.Module], bool]:
    def candidate(m: torch.nn.Module) -> bool:
        return any(isinstance(getattr(m, n, None), torch.nn.Module) and norm_kind(type(getattr(m, n))) is not None
                   for n in norms)
    return candidate


#: a rewritten forward's fusion, by its sites: all post-norm, all pre-norm (the sum kept), or both
ADD_NORM_SITE_FUSIONS = {(True, False): "residual add + norm (post-norm)", (False, True): "residual add + norm (pre-norm)",
                         (True, True): "residual add + norm (post- and pre-norm)"}


@cache
def _add_norm_fusion(cls: type) -> BlockFusion | None:
    found = add_norm_form(cls, add_then_norm, add_norm_and_sum)
    if found is None:
        return None
    rewritten, plain, summed = found
    norms = found.norms
    original = inspect.unwrap(cls.forward)

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():  # Dynamo guards a function's globals as its module's: never shown the copy
            return original(self, *args, **kwargs)
        if pre_norm_only and not _grad_enabled():  # no site would fuse (add_norm_and_sum) unless a graph is captured
            x = args[0] if args else next(iter(kwargs.values()), None)
            if not (isinstance(x, torch.Tensor) and _capturing(x)):
                return original(self, *args, **kwargs)
        return rewritten(self, *args, **kwargs)

    pre_norm_only = not plain

    return BlockFusion(ADD_NORM_SITE_FUSIONS[bool(plain), bool(summed)], "", forward, _add_norm_problem(norms),
                       candidate=_has_a_norm(norms), add_norms=plain, add_norms_summed=summed)


@cache
def _fusion_for(cls: type) -> BlockFusion | None:
    src = _class_forward(cls)
    for f in FUSIONS:
        method = src if f.method == "forward" else _class_forward(cls, f.method)
        if method is not None and method == canonical(f.original):
            return f
    if src is None:
        return None
    form = gated_form(cls)
    if form is not None:
        return _gated_fusion(form)
    kind = norm_kind(cls)
    if kind is not None and kind.kind == "rms":  # Helium-, Gemma- or T5-style RMSNorm
        return _RMS_NORM_SAME_DTYPE if kind.same_dtype else FUSIONS[-1]
    chain = mlp_chain(cls)
    if chain is not None and len(chain) in (3, 4) and len(set(chain)) == len(chain):  # up, activation, down[, dropout]
        return _chain_fusion(chain)
    return _add_norm_fusion(cls)


def matching(module: torch.nn.Module) -> BlockFusion | None:
    """The fusion whose known forward ``module``'s class has, where ``module`` is its candidate;
    unlike ``fusion_for``, whatever the state of its children (a patched model's, when it loads)."""
    fusion = _fusion_for(type(module))
    return None if fusion is None or (fusion.candidate is not None and not fusion.candidate(module)) else fusion


def fusion_for(module: torch.nn.Module) -> tuple[BlockFusion | None, str | None]:
    """``(fusion, None)`` where ``module`` can take one, ``(fusion, why not)`` where its forward
    matches but it cannot, ``(None, None)`` where its forward is none of the known ones."""
    fusion = matching(module)
    if fusion is None:
        return None, None
    if hooked(module):
        return fusion, "the module has hooks"
    if fusion.method in module.__dict__:
        return fusion, f"its {fusion.method} is already replaced on the instance"
    return fusion, fusion.problem(module)


def apply(module: torch.nn.Module, fusion: BlockFusion) -> None:
    """Give ``module`` the fused forward and the record of its step, resolved now: the norm's
    kind, eps attribute and offset, or the projections and the activation
    (``xkernels/block_steps.py``; undo: ``restore``)."""
    if fusion.feed_forward is not None:
        module._xkernels_block = fusion.feed_forward
    elif fusion.add_norms or fusion.add_norms_summed:
        module._xkernels_block = AddNormSteps(*({n: _norm_step(module, n, summed) for n in names
                                                 if _site_norm_problem(module, n) is None}
                                                for names, summed in ((fusion.add_norms, False),
                                                                      (fusion.add_norms_summed, True))))
    elif fusion.method == "_apply_gate":  # the experts' gate: the activation (or a clamped gate's numbers)
        form = fusion.clamped
        act_kind = activation_kind(module.act_fn) if form is None or form.act_fn else ()
        routed = None if "forward" in module.__dict__ else experts_interface(type(module))
        module._xkernels_block = ExpertsGate(None if form else gate_activation(module.act_fn), act_kind, form, routed)
        if routed is not None:  # and the routing passes around its grouped GEMMs
            module.forward = types.MethodType(routed_forward, module)
    elif fusion.activation is not None:
        activation = gate_activation(getattr(module, fusion.activation))
        assert activation is not None  # the fusion's ``problem`` checked it
        form = fusion.gated
        module._xkernels_block = gated_step(form.proj, activation, form.chain, form.gate_first, fusion.activation,
                                            getattr(module, fusion.activation))
    else:
        module._xkernels_block = _norm_step(module, None if fusion.norm_itself else fusion.norm, fusion.return_sum)
    forward = checkpointed(type(module), fusion.forward) if fusion.method == "forward" else fusion.forward
    setattr(module, fusion.method, types.MethodType(forward, module))


def restore(module: torch.nn.Module) -> None:
    """The module's own forward (and other replaced methods) again."""
    for method in METHODS:
        module.__dict__.pop(method, None)
    module.__dict__.pop("_xkernels_block", None)
