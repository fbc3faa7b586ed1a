"""The patched blocks' rows of ``python -m xkernels.bench --host``: torch's module against the same
module after ``xkernels.patch`` (``xkernels/blocks.py``), one forward per call, under ``no_grad``.

The modules are local classes whose ``forward`` is, statement for statement, the transformers
original the block fusions recognise (detection is by source, so ``patch`` fuses them exactly as
it fuses a transformers model's; transformers itself is not needed):

* ``BERT output block``: BertSelfOutput's forward (dense, dropout, ``LayerNorm(h + input)``);
* ``Llama decoder layer (add+norm steps)``: Llama's decoder layer with a pass-through attention
  and MLP, so the row holds the layer's own Python, its input RMSNorm, the residual add with the
  post-attention RMSNorm, and the last residual add;
* ``Llama MLP``: ``down(act(gate(x)) * up(x))``;
* ``MoE experts' gate``: a mixture-of-experts module's ``_apply_gate`` (transformers'
  ``@use_experts_implementation`` default, between its grouped GEMMs) on Mixtral's routed rows
  at 16 tokens (32 rows of 2 x 14336 on cuda; 2 x 704 on the CPU);
* ``Llama attention's rotary embedding``: an attention stand-in whose forward calls this
  module's ``apply_rotary_pos_emb`` (Llama's, as transformers 5.23 has it) on Llama-3-8B's heads
  at 16 tokens and returns q and k (``xkernels/rotary_fusion.py`` binds it to the op).

The training rows (:func:`training_forms`) time one forward and backward per call, gradients
required of the input and the parameters (modules in eval mode: no dropout), as a training step
runs them: a linear layer as ``xkernels.nn.Linear`` (its training policy decides, as in a patched
model: on a host-bound GPU, PyTorch's ops from the native table), the same with GELU, the BERT
output block, ``F.linear`` under ``enabled()``, the rotary embedding (q and k requiring grad) and the
experts' gate (gate_up requiring grad).

Sizes: BERT-base's 768 features; a TinyLlama-sized layer (hidden 2048, intermediate 5632) on
cuda, a small one (256, 704) on the CPU, where the torch column computes and is for scale only.
Host time does not depend on the size (the launch is the same), the device's work does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

import xkernels

Form = tuple[str, Callable[[], Any], Callable[[], Any]]


class RMSNorm(torch.nn.Module):
    """Llama's RMSNorm (its forward as transformers 5.23 has it)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):  # type: ignore[no-untyped-def]
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class PassAttention(torch.nn.Module):
    """An attention stand-in: returns its input (and no weights), as the decoder layer unpacks."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return hidden_states, None


class DecoderLayer(torch.nn.Module):
    """Llama's decoder layer (its forward as transformers 5.23 has it), attention and MLP given."""

    def __init__(self, hidden: int, attn: torch.nn.Module, mlp: torch.nn.Module) -> None:
        super().__init__()
        self.self_attn, self.mlp = attn, mlp
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(hidden), RMSNorm(hidden)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,  # type: ignore[no-untyped-def]
                use_cache=False, position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, past_key_values=past_key_values,
                                          use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class BertSelfOutput(torch.nn.Module):
    """BERT's output block (its forward as transformers 5.23 has it)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(hidden, hidden)
        self.LayerNorm = torch.nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, hidden_states, input_tensor):  # type: ignore[no-untyped-def]
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states


class LlamaMLP(torch.nn.Module):
    """Llama's MLP (its forward as transformers 5.23 has it)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = torch.nn.Linear(intermediate, hidden, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):  # type: ignore[no-untyped-def]
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class Experts(torch.nn.Module):
    """A mixture-of-experts module's gate (transformers' default ``_apply_gate``, 5.23); the
    grouped GEMMs around it are left out."""

    def __init__(self) -> None:
        super().__init__()
        self.act_fn = torch.nn.SiLU()

    def _apply_gate(self, gate_up_out):  # type: ignore[no-untyped-def]
        gate, up = gate_up_out.chunk(2, dim=-1)
        return self.act_fn(gate) * up


def rotate_half(x):  # type: ignore[no-untyped-def]
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
    """Llama's (transformers 5.23)."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class RotaryAttention(torch.nn.Module):
    """An attention stand-in that only applies the rotary embedding to its q and k."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        return apply_rotary_pos_emb(q, k, cos, sin)


def _rotary_operands(device: torch.device, dtype: torch.dtype, grad: bool = False) -> tuple[torch.Tensor, ...]:
    """q, k in transformers' layout (Llama-3-8B's 32 / 8 heads of 128 at 16 tokens), cos, sin."""
    s, d = 16, 128
    q = torch.randn(1, s, 32 * d, device=device, dtype=dtype).view(1, s, 32, d).transpose(1, 2)
    k = torch.randn(1, s, 8 * d, device=device, dtype=dtype).view(1, s, 8, d).transpose(1, 2)
    f = torch.arange(s, device=device, dtype=torch.float32)[:, None] / 10000 ** (
        torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    emb = torch.cat((f, f), dim=-1)[None]
    if grad:
        q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


def _patched(module: torch.nn.Module, fusions: dict[str, int]) -> torch.nn.Module:
    """A patched deep copy of ``module`` (the original stays torch's), checked to hold ``fusions``."""
    twin = copy.deepcopy(module)
    counts = {k: v for k, v in xkernels.patch(twin).counts().items() if k not in ("linear", "linear + activation")}
    if counts != fusions:
        raise RuntimeError(f"xkernels.bench --host: patch() fused {counts} in {type(module).__name__}, "
                           f"expected {fusions}")
    return twin


def block_forms(device: torch.device, dtype: torch.dtype) -> list[Form]:
    """(label, the patched module's forward, torch's module's forward) of each block, eval mode."""
    hidden, inter = (2048, 5632) if device.type == "cuda" else (256, 704)
    mk = lambda m: m.to(device=device, dtype=dtype).eval()  # noqa: E731
    bert = mk(BertSelfOutput(768))
    layer = mk(DecoderLayer(hidden, PassAttention(), torch.nn.Identity()))
    mlp = mk(LlamaMLP(hidden, inter))
    with torch.no_grad():
        for m in (bert, layer):  # norm weights off 1 and biases off 0: a real affine step
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    r = lambda *s: torch.randn(*s, device=device, dtype=dtype)  # noqa: E731
    bert_x, bert_in, h, x = r(1, 16, 768), r(1, 16, 768), r(1, 16, hidden), r(1, 16, hidden)
    bert_p = _patched(bert, {"residual add + norm (output block)": 1})
    layer_p = _patched(layer, {"residual add + norm (pre-norm decoder layer)": 1, "rms norm": 2})
    mlp_p = _patched(mlp, {"gated mlp": 1})
    rope = RotaryAttention()
    rope_p = _patched(rope, {"rotary embedding": 1})
    qkcs = _rotary_operands(device, dtype)
    experts = Experts()
    experts_p = _patched(experts, {"experts gate": 1})
    gate_up = r(32, 2 * inter if device.type != "cuda" else 2 * 14336)
    return [
        ("BERT output block", lambda: bert_p(bert_x, bert_in), lambda: bert(bert_x, bert_in)),
        ("Llama decoder layer (add+norm steps)", lambda: layer_p(h), lambda: layer(h)),
        ("Llama MLP", lambda: mlp_p(x), lambda: mlp(x)),
        ("MoE experts' gate", lambda: experts_p._apply_gate(gate_up), lambda: experts._apply_gate(gate_up)),
        ("Llama attention's rotary embedding", lambda: rope_p(*qkcs), lambda: rope(*qkcs)),
    ]


def training_forms(device: torch.device, dtype: torch.dtype) -> list[Form]:
    """(label, xkernels' forward + backward, torch's) of the training rows (module doc)."""
    from xkernels import nn as xnn

    r = lambda *s, grad=False: torch.randn(*s, device=device, dtype=dtype).requires_grad_(grad)  # noqa: E731
    lin = torch.nn.Linear(768, 768, device=device, dtype=dtype)
    lin_x = xnn.Linear.from_linear(copy.deepcopy(lin))
    up = torch.nn.Linear(768, 3072, device=device, dtype=dtype)
    up_x = xnn.Linear.from_linear(copy.deepcopy(up), "gelu")
    bert = BertSelfOutput(768).to(device=device, dtype=dtype).eval()
    bert_p = _patched(bert, {"residual add + norm (output block)": 1})
    x, h, dy, dy_up = r(1, 16, 768, grad=True), r(1, 16, 768, grad=True), r(1, 16, 768), r(1, 16, 3072)
    w, b = r(768, 768, grad=True), r(768, grad=True)
    gelu = torch.nn.functional.gelu
    linear = torch.nn.functional.linear
    rope = RotaryAttention()
    rope_p = _patched(rope, {"rotary embedding": 1})
    q, k, cos, sin = _rotary_operands(device, dtype, grad=True)
    dq, dk = torch.randn_like(q), torch.randn_like(k)

    experts = Experts()
    experts_p = _patched(experts, {"experts gate": 1})
    gate_up, d_gate = r(32, 2 * 3072, grad=True), r(32, 3072)

    def rope_step(module: torch.nn.Module) -> Callable[[], Any]:
        return lambda: torch.autograd.backward(module(q, k, cos, sin), (dq, dk))

    return [
        ("training: nn.Linear module", lambda: lin_x(x).backward(dy), lambda: lin(x).backward(dy)),
        ("training: nn.Linear + GELU", lambda: up_x(x).backward(dy_up), lambda: gelu(up(x)).backward(dy_up)),
        ("training: BERT output block", lambda: bert_p(x, h).backward(dy), lambda: bert(x, h).backward(dy)),
        ("training: enabled(): F.linear", lambda: linear(x, w, b).backward(dy), lambda: linear(x, w, b).backward(dy)),
        ("training: rotary embedding", rope_step(rope_p), rope_step(rope)),
        ("training: MoE experts' gate", lambda: experts_p._apply_gate(gate_up).backward(d_gate),
         lambda: experts._apply_gate(gate_up).backward(d_gate)),
    ]
