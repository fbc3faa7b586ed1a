"""The routed experts' forward ``patch()`` gives a mixture-of-experts module whose gate it fuses
(``xkernels/experts_gates.py``): transformers' ``grouped_mm`` experts forward with the routing
passes around the grouped GEMMs done by ``ops/fused/experts_routing.py``.

transformers 5.23's ``@use_experts_implementation`` classes (Mixtral, Qwen2/3-MoE, DeepSeek-V3,
OLMoE, GPT-OSS, ...) pick their forward per call from an experts interface by
``config._experts_implementation``; the default, ``grouped_mm``, is
:data:`GROUPED_MM_EXPERTS_FORWARD`. The forward set here computes the same thing with two steps
changed:

* the tokens' rows gathered in expert order (``hidden_states[perm // K]``) get a backward that
  sums each token's K gradient rows in one pass (PyTorch's: a sort and a scatter-add into zeros);
* the weighted sum (``proj * w[perm]``, ``[inv_perm]``, ``.view(T, K, H).sum(1)``, ``.to()``) is
  one pass each way, the rows read in place.

The GEMMs, the gate (the module's own ``_apply_gate``, fused or not), the biases and a post-expert
norm are transformers' own functions, called as its forward calls them. The class's forward runs
instead, per call, unless every condition holds: the implementation is ``grouped_mm`` and the
class's interface maps it to transformers' function whose source is the one below (another
transformers, a registered replacement, ``batched_mm``, ``eager`` run the class's code), no
expert parallelism (its sentinel rows), not while ``torch.compile`` traces, a backend that runs
Triton kernels, 2-D hidden states.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from xkernels import dispatch
from xkernels.ops.fused.experts_routing import combine_routed, gather_routed
from xkernels.ops.op import _is_compiling
from xkernels.source_forms import canonical

#: transformers 5.23's ``grouped_mm_experts_forward`` (``transformers/integrations/moe.py``), comments aside
GROUPED_MM_EXPERTS_FORWARD = '''
def grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    device = hidden_states.device
    num_top_k = top_k_index.size(-1)
    num_tokens = hidden_states.size(0)
    hidden_dim = hidden_states.size(-1)
    sample_weights = top_k_weights.reshape(-1)
    expert_ids = top_k_index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)
    selected_hidden_states_g = hidden_states[perm // num_top_k]
    sample_weights_g = sample_weights[perm]
    histc_input = expert_ids_g.float() if device.type in ("cpu", "mps") else expert_ids_g.int()
    tokens_per_expert = torch.histc(histc_input, bins=self.num_experts, min=0, max=self.num_experts - 1)
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    sentinel_mask = None
    if self._is_expert_parallel:
        sentinel_mask = (expert_ids_g >= self.num_experts).unsqueeze(-1)
        expert_ids_g.clamp_(max=self.num_experts - 1)
    if self.has_gate:
        selected_weights = self.gate_up_proj
        selected_biases = self.gate_up_proj_bias[expert_ids_g] if self.has_bias else None
    else:
        selected_weights = self.up_proj
        selected_biases = self.up_proj_bias[expert_ids_g] if self.has_bias else None
    if sentinel_mask is not None:
        selected_hidden_states_g.masked_fill_(sentinel_mask, 0.0)
    proj_out = _grouped_linear(
        selected_hidden_states_g, selected_weights, offsets, bias=selected_biases, is_transposed=self.is_transposed
    )
    if sentinel_mask is not None:
        proj_out = proj_out.masked_fill(sentinel_mask, 0.0)
    if self.has_gate:
        proj_out = self._apply_gate(proj_out)
    else:
        proj_out = self.act_fn(proj_out)
    selected_weights = self.down_proj
    selected_biases = self.down_proj_bias[expert_ids_g] if self.has_bias else None
    proj_out = _grouped_linear(
        proj_out, selected_weights, offsets, bias=selected_biases, is_transposed=self.is_transposed
    )
    if sentinel_mask is not None:
        proj_out = proj_out.masked_fill(sentinel_mask, 0.0)
    if self.has_post_expert_norm:
        proj_out = self.post_expert_norm(proj_out)
    weighted_out = proj_out * sample_weights_g.unsqueeze(-1)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0), device=device)
    weighted_out = weighted_out[inv_perm]
    final_hidden_states = weighted_out.view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
    return final_hidden_states.to(hidden_states.dtype)
'''
#: the forward ``@use_experts_implementation`` puts on a class (it picks the implementation per call)
_DISPATCHER = "use_experts_implementation.<locals>.wrapper.<locals>.forward"


def _moe() -> Any:
    try:
        from transformers.integrations import moe
    except Exception:  # no transformers, or a half-installed one: nothing of it to replace
        return None
    return moe


@cache
def _known_grouped_forward(fn: Any) -> bool:
    """Whether ``fn`` is transformers' ``grouped_mm`` experts forward as this module knows it."""
    moe = _moe()
    return moe is not None and fn is getattr(moe, "grouped_mm_experts_forward", None) and (
        canonical(fn) == canonical(GROUPED_MM_EXPERTS_FORWARD))


def experts_interface(cls: type) -> Any:
    """The experts interface ``cls``'s forward picks its implementation from, where that forward is
    ``@use_experts_implementation``'s and the interface can give transformers' known ``grouped_mm``
    forward; else ``None`` (the class keeps its forward)."""
    fn = getattr(cls, "forward", None)
    code = getattr(fn, "__code__", None)
    moe = _moe()
    if code is None or moe is None or code.co_qualname != _DISPATCHER or code.co_filename != moe.__file__:
        return None
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    try:
        interface = cells["experts_interface"].cell_contents
        found = interface.get("grouped_mm")
    except (KeyError, ValueError, AttributeError):
        return None
    return interface if _known_grouped_forward(found) else None


def _routes_every_token(hidden_states: torch.Tensor, top_k_index: Any, top_k_weights: Any) -> bool:
    """Whether the routing is (tokens, top_k) for every token, one weight per choice: what
    transformers' forward's ``.view(num_tokens, num_top_k, hidden_dim)`` requires (any other call
    goes to it, which raises as it does)."""
    return (isinstance(top_k_index, torch.Tensor) and isinstance(top_k_weights, torch.Tensor)
            and top_k_index.dim() >= 1 and top_k_weights.shape == top_k_index.shape
            and top_k_index.numel() == hidden_states.size(0) * top_k_index.size(-1))


#: the arguments transformers' experts forwards take, in order
_ARGS = ("hidden_states", "top_k_index", "top_k_weights")


def routed_forward(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``grouped_mm_experts_forward`` with the routing passes fused (module doc); the class's own
    forward where a condition fails, or for any other arguments than ``_ARGS``."""
    given = len(args)
    if given > 3 or given + len(kwargs) != 3 or not set(kwargs) <= set(_ARGS[given:]):
        return type(self).forward(self, *args, **kwargs)
    hidden_states, top_k_index, top_k_weights = (*args, *(kwargs[n] for n in _ARGS[given:]))
    if (_is_compiling() or getattr(self.config, "_experts_implementation", None) != "grouped_mm"
            or not _known_grouped_forward(self._xkernels_block.routed.get("grouped_mm"))
            or getattr(self, "_is_expert_parallel", False)
            or not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2
            or not _routes_every_token(hidden_states, top_k_index, top_k_weights)
            or not dispatch.select(hidden_states.device).runs_triton):
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)
    moe = _moe()
    device = hidden_states.device
    num_top_k = top_k_index.size(-1)
    sample_weights = top_k_weights.reshape(-1)
    expert_ids_g, perm = torch.sort(top_k_index.reshape(-1))
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0), device=device)
    rows = perm // num_top_k
    selected = gather_routed(hidden_states, rows, inv_perm, num_top_k)
    if selected is None:
        selected = hidden_states[rows]
    histc_input = expert_ids_g.float() if device.type in ("cpu", "mps") else expert_ids_g.int()
    tokens_per_expert = torch.histc(histc_input, bins=self.num_experts, min=0, max=self.num_experts - 1)
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    up = self.gate_up_proj if self.has_gate else self.up_proj
    up_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias)[expert_ids_g] if self.has_bias else None
    proj_out = moe._grouped_linear(selected, up, offsets, bias=up_bias, is_transposed=self.is_transposed)
    proj_out = self._apply_gate(proj_out) if self.has_gate else self.act_fn(proj_out)
    down_bias = self.down_proj_bias[expert_ids_g] if self.has_bias else None
    proj_out = moe._grouped_linear(proj_out, self.down_proj, offsets, bias=down_bias, is_transposed=self.is_transposed)
    if self.has_post_expert_norm:
        proj_out = self.post_expert_norm(proj_out)
    out = combine_routed(proj_out, sample_weights, inv_perm, num_top_k, hidden_states.dtype)
    if out is None:  # transformers' composition
        weighted = (proj_out * sample_weights[perm].unsqueeze(-1))[inv_perm]
        out = weighted.view(hidden_states.size(0), num_top_k, hidden_states.size(-1)).sum(dim=1).to(hidden_states.dtype)
    return out
