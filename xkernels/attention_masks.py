"""Attention masks for ``xkernels.patch``: a mask broadcast along the keys reaches the attention
call as a dense copy.

PyTorch's ``scaled_dot_product_attention`` runs its fused kernels (cuDNN, flash, memory-efficient)
only for a mask whose last dim, the keys, has unit stride. A mask broadcast along the keys
(stride 0) sends it to its math path, which on CUDA computes a half-precision attention in
float32 with CUDA-core GEMMs. transformers makes exactly such a mask for every bidirectional
attention while ``torch.compile`` traces with torch < 2.14: it cannot skip the all-true mask there
(``masking_utils._ignore_bidirectional_mask_sdpa``; Dynamo folded ``torch.compiler.is_exporting()``
to ``True`` before pytorch#176499), and the mask it builds without padding is the same value for
every key. On an H200, BERT-base's attention shape (16 x 12 x 512 x 64, bf16) takes 2.36 ms forward
+ backward on that path against 0.45 ms with the same mask dense (cuDNN) and 0.24 ms with none
(``results/2026-12-02-h200-attention-mask-layout``); compiled BERT-base's training step spent over
half its device time there, torch's and a patched model's alike.

:func:`targets` finds the modules whose forward passes its ``attention_mask`` argument straight to
an attention function (transformers' ``attention_interface`` / ``ALL_ATTENTION_FUNCTIONS`` lookup,
``sdpa_attention_forward`` or ``F.scaled_dot_product_attention``), except causal ones
(``module.is_causal`` true: their masks are built from the query and key positions, never
broadcast along the keys). :func:`apply` gives each a forward pre-hook that replaces such a mask
(a tensor of two or more dims, more than one key, stride 0 along the keys) by ``mask.contiguous()``:
the same values, so the same attention by SDPA's definition, in a layout its fused kernels take.
Any other mask, ``None`` included, passes untouched. The hook costs a module call about a
microsecond of host time in eager mode and nothing in a compiled graph; the copy is the mask's
size (4 MiB per call for BERT-base's 16 x 512 x 512). A hook is part of the module's state, so a
copy or a saved and loaded model keeps it; ``PatchReport.undo()`` removes it.
"""

from __future__ import annotations

import ast
import functools
import inspect
from typing import Any

import torch

from xkernels.source_forms import function_node

__all__ = ["FUSION", "NOTE", "apply", "dense_mask", "has_hook", "targets"]

#: what ``patch()`` reports for a module given the hook
FUSION = "dense attention mask"
#: its note in the report
NOTE = ("a mask broadcast along the keys (transformers' bidirectional mask while torch.compile traces, torch < 2.14) "
        "reaches the attention call dense, so SDPA's fused kernels take it instead of its float32 math path")

#: the names a forward calls an attention function by
_ATTENTION_CALLS = frozenset({"attention_interface", "sdpa_attention_forward", "scaled_dot_product_attention"})
_MASK = "attention_mask"


def dense_mask(mask: Any) -> Any:
    """``mask.contiguous()`` for a tensor mask broadcast along its last dim (more than one key,
    stride 0 there); anything else as it is."""
    if isinstance(mask, torch.Tensor) and mask.dim() >= 2 and mask.size(-1) > 1 and mask.stride(-1) == 0:
        return mask.contiguous()
    return mask


def _hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *,
          position: int | None) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The forward pre-hook: the ``attention_mask`` argument, by position or by name, made dense."""
    if position is not None and position < len(args):
        mask = args[position]
        dense = dense_mask(mask)
        return None if dense is mask else ((*args[:position], dense, *args[position + 1:]), kwargs)
    mask = kwargs.get(_MASK)
    dense = dense_mask(mask)
    return None if dense is mask else (args, {**kwargs, _MASK: dense})


@functools.lru_cache(maxsize=256)
def _mask_position(cls: type) -> tuple[bool, int | None]:
    """``(True, position)`` where ``cls.forward`` passes its ``attention_mask`` parameter straight to
    an attention call (``position``: the parameter's index among the positional arguments after
    ``self``, ``None`` for keyword-only); ``(False, None)`` otherwise."""
    fn = getattr(cls, "forward", None)
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return False, None
    param = next((p for p in params if p.name == _MASK), None)
    node = function_node(fn) if param is not None else None
    if node is None:
        return False, None
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
        passed = [*call.args, *(k.value for k in call.keywords)]
        if name in _ATTENTION_CALLS and any(isinstance(a, ast.Name) and a.id == _MASK for a in passed):
            positional = param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            return True, (params.index(param) if positional else None)
    return False, None


def has_hook(module: torch.nn.Module) -> bool:
    """Whether ``module`` already has this module's pre-hook (``patch()`` run twice)."""
    return any(isinstance(h, functools.partial) and h.func is _hook for h in module._forward_pre_hooks.values())


def targets(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, int | None]]:
    """``(qualified name, module, mask position)`` of the modules :func:`apply` hooks (module doc)."""
    out = []
    for name, module in model.named_modules():
        if getattr(module, "is_causal", False) is True or has_hook(module):
            continue
        found, position = _mask_position(type(module))
        if found:
            out.append((name, module, position))
    return out


def apply(module: torch.nn.Module, position: int | None) -> torch.utils.hooks.RemovableHandle:
    """Give ``module`` the pre-hook; the handle removes it."""
    return module.register_forward_pre_hook(functools.partial(_hook, position=position), with_kwargs=True)
