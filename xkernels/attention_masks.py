"""Attention masks for ``xkernels.patch``: a boolean mask that has one value per query row (the
same for every key) runs as no mask, its masked rows zeroed.

PyTorch's ``scaled_dot_product_attention`` runs its fused kernels (cuDNN, flash, memory-efficient)
only for a mask whose last dim, the keys, has unit stride. A mask broadcast along the keys
(stride 0) sends it to its math path, which on CUDA computes a half-precision attention in
float32 with CUDA-core GEMMs. transformers builds exactly such a mask for every bidirectional
attention while ``torch.compile`` traces with torch < 2.14: it cannot skip the all-true mask
there (``masking_utils._ignore_bidirectional_mask_sdpa``; Dynamo folded
``torch.compiler.is_exporting()`` to ``True`` before pytorch#176499), and the mask it builds
without padding has the same value for every key. On an H200, BERT-base's attention shape (16 x 12
x 512 x 64, bf16) takes 2.4 ms forward + backward on that path against 0.29 ms with no mask
(``results/2026-12-02-h200-attention-mask-under-compile``); compiled BERT-base's training step
spent over half its device time there, torch's and a patched model's alike.

A dense copy of the mask is not the answer: cuDNN's kernel gives a row masked whole values that are
not the math path's zeros (bf16, same results directory). But a mask constant along the keys says
only which query rows attend to every key and which to none, so the attention it describes is the
unmasked one (``attn_mask=None``, not causal) with the masked rows zeroed, the zeros PyTorch's math
path gives such rows (``_safe_softmax``), and no gradient through them. :func:`attention` computes
that around transformers' own ``sdpa`` function; any other mask (float masks, masks that differ
along the keys, ``None``) and any call with a ``position_bias`` go to that function unchanged.

``patch()`` reaches it through transformers' own dispatch: an attention module that looks its
function up by ``self.config._attn_implementation`` (``ALL_ATTENTION_FUNCTIONS.get_interface``),
passes its ``attention_mask`` argument to it and is not causal (``module.is_causal`` true: causal
masks are built from the positions, never constant along the keys) gets, as its ``config``, an
:class:`AttentionConfig`: the model's config object itself for every read and write but
``_attn_implementation``, which reads :data:`NAME` where the config says ``"sdpa"``. :data:`NAME`
is registered in transformers' ``AttentionInterface`` as :func:`attention`. The model's own
config, its mask creation and every other module are untouched; a later
``model.set_attn_implementation("eager")`` reaches the proxied module too. A copy or a saved and
loaded model keeps the proxy (it pickles as itself around the config, which pickle and deepcopy
share with the rest of the model); ``PatchReport.undo()`` puts the config back. The call costs an
eager forward one more Python function per attention module and a compiled graph nothing.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from typing import Any

import torch

from xkernels.source_forms import function_node

__all__ = ["FUSION", "NAME", "NOTE", "AttentionConfig", "apply", "attention", "rows_of", "targets", "undo"]

#: the attention implementation registered in transformers' ``AttentionInterface``
NAME = "xkernels_sdpa"
#: what ``patch()`` reports for a module given the proxy
FUSION = "attention mask by rows"
#: its note in the report
NOTE = ("a boolean mask with one value per query row (transformers' bidirectional mask while torch.compile traces, "
        "torch < 2.14) runs as no mask with its masked rows zeroed, so SDPA's fused kernels run instead of its float32 "
        "math path; under 'sdpa' only")

_MASK = "attention_mask"


def rows_of(mask: Any) -> torch.Tensor | None:
    """``mask[..., :1]`` for a 4-D boolean mask broadcast along its last dim (more than one key,
    stride 0 there): one value per (batch, head, query) row; ``None`` for anything else."""
    if (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 4 and mask.size(-1) > 1
            and mask.stride(-1) == 0):
        return mask[..., :1]
    return None


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """transformers' ``sdpa`` attention function, but for a mask :func:`rows_of` takes: the
    attention without a mask (not causal), each row the mask keeps as computed, each row it masks
    zero (module doc). The output is that function's: (batch, queries, heads, head dim)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows = rows_of(attention_mask)
    if rows is None or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    if len(args) > 2:  # dropout, scaling, is_causal by position
        args = (*args[:2], False, *args[3:])
    else:
        kwargs = {**kwargs, "is_causal": False}
    out, weights = sdpa_attention_forward(module, query, key, value, None, *args, **kwargs)
    keep = rows.transpose(1, 2)  # (batch, queries, heads or 1, 1), as the output's (batch, queries, heads, dim)
    return torch.where(keep, out, out.new_zeros(())), weights


def _register() -> None:
    """:data:`NAME` in transformers' ``AttentionInterface`` (idempotent)."""
    from transformers.modeling_utils import AttentionInterface

    if AttentionInterface._global_mapping.get(NAME) is not attention:
        AttentionInterface.register(NAME, attention)


def _proxy(config: Any) -> AttentionConfig:
    _register()
    return AttentionConfig(config)


class AttentionConfig:
    """A module's config: the model's config object for every read and write, but
    ``_attn_implementation``, which reads :data:`NAME` where the config's is ``"sdpa"``."""

    def __init__(self, config: Any) -> None:
        object.__setattr__(self, "_xkernels_config", config)

    @property
    def _attn_implementation(self) -> Any:
        implementation = self._xkernels_config._attn_implementation
        return NAME if implementation == "sdpa" else implementation

    @_attn_implementation.setter
    def _attn_implementation(self, value: Any) -> None:
        self._xkernels_config._attn_implementation = value

    def __getattr__(self, name: str) -> Any:
        # not yet set (an unpickling's probe), or a protocol probe (``__deepcopy__``, ``__getstate__``): the
        # proxy's own, never the config's methods bound to the config (a copy would be the bare config)
        if name == "_xkernels_config" or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self._xkernels_config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._xkernels_config, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return _proxy, (self._xkernels_config,)

    # what Python looks up on the type, not through ``__getattr__``: answered as the config answers
    # (``proxy == model.config``, iteration). ``isinstance(proxy, BertConfig)`` stays ``False``: a
    # ``__class__`` answering the config's type made Dynamo read the config's ``_attn_implementation``.
    def __eq__(self, other: object) -> bool:
        if type(other) is AttentionConfig:
            other = other._xkernels_config
        return self._xkernels_config == other

    __hash__ = None  # type: ignore[assignment]  # as a config's: equality by value

    def __iter__(self) -> Any:
        return iter(self._xkernels_config)

    def __repr__(self) -> str:
        return f"AttentionConfig({self._xkernels_config!r})"


@functools.lru_cache(maxsize=256)
def _passes_mask(cls: type) -> bool:
    """Whether ``cls.forward`` takes ``attention_mask``, looks its attention function up in
    transformers' interface by ``self.config._attn_implementation`` and passes the mask to it."""
    fn = getattr(cls, "forward", None)
    try:
        if _MASK not in inspect.signature(fn).parameters:
            return False
    except (TypeError, ValueError):
        return False
    node = function_node(fn)
    if node is None:
        return False
    source = ast.dump(node)
    if "get_interface" not in source or "_attn_implementation" not in source:
        return False
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "attention_interface":
            passed = [*call.args, *(k.value for k in call.keywords)]
            if any(isinstance(a, ast.Name) and a.id == _MASK for a in passed):
                return True
    return False


def targets(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(qualified name, module)`` of the modules :func:`apply` gives the proxy (module doc)."""
    if "transformers" not in sys.modules:
        return []
    out = []
    for name, module in model.named_modules():
        config = module.__dict__.get("config")
        if (getattr(module, "is_causal", False) is True or config is None or type(config) is AttentionConfig
                or not hasattr(config, "_attn_implementation")):
            continue
        if _passes_mask(type(module)):
            out.append((name, module))
    return out


def apply(module: torch.nn.Module) -> None:
    """Give ``module`` the proxy of its config (registering :data:`NAME`)."""
    module.__dict__["config"] = _proxy(module.__dict__["config"])


def undo(module: torch.nn.Module) -> None:
    """The module's own config again."""
    config = module.__dict__.get("config")
    if type(config) is AttentionConfig:
        module.__dict__["config"] = config._xkernels_config
