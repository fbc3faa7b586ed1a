"""Saving and copying a patched model: ``torch.save(model)`` / ``pickle`` and ``copy.deepcopy`` /
``copy.copy`` of a module ``xkernels.patch`` gave a fused forward.

Such a module's fused forward is a method bound on the instance, with a record of its step
(route caches, a copy of a modeling module's globals for the rotary fusion): none of it can be
pickled, and none of it should be, since it is resolved from the module and its class. So each
patched module carries its own ``__reduce_ex__`` (``keep``): it saves the module's state without
them, with what was fused; loading (or copying) rebuilds the module from that state and patches
it again, from its class as the loading process has it. The loaded model is patched as the saved
one was, and computes what it computed.

Where the class no longer takes that fusion when the file is loaded (another transformers
version changed its forward, a hook was added before saving), the module runs its own forward and
a ``UserWarning`` says which and why. A file saved from a patched model needs xkernels to load;
``PatchReport.undo()`` before saving writes one that does not (the swapped linear layers are
``xkernels.nn`` modules until then).

``nn.DataParallel``'s replicas are shallow copies of each module (``_replicate_for_data_parallel``:
the instance ``__dict__`` copied, the parameters set anew per device). A patched module's
``_replicate_for_data_parallel`` (also from ``keep``) binds the replica's fused forward (and every
other method bound on the instance) to the replica, so each replica computes with its own
parameters on its own device; the record of the step is shared, since it holds only names, kinds
and route caches keyed by device.
"""

from __future__ import annotations

import functools
import types
import warnings
from typing import Any

import torch

from xkernels import blocks, rotary_fusion
from xkernels.block_steps import hooked

__all__ = ["forget", "fused", "keep"]

#: instance attributes a fused forward adds (``blocks.apply``, ``rotary_fusion.apply``, ``keep``): never saved
_PATCH_ATTRS = frozenset({"__reduce_ex__", "_replicate_for_data_parallel", "_xkernels_block", "forward",
                          *blocks.METHODS})


def keep(module: torch.nn.Module, fusion: str) -> None:
    """Make the patched ``module`` save, copy and replicate (``nn.DataParallel``) as itself patched
    by ``fusion`` (its reported name)."""
    module.__dict__["__reduce_ex__"] = types.MethodType(functools.partial(_reduce, fusion=fusion), module)
    module.__dict__["_replicate_for_data_parallel"] = types.MethodType(_replicate, module)


def forget(module: torch.nn.Module) -> None:
    """Undo ``keep`` (the module is unpatched again)."""
    module.__dict__.pop("__reduce_ex__", None)
    module.__dict__.pop("_replicate_for_data_parallel", None)


def _replicate(module: torch.nn.Module) -> torch.nn.Module:
    """``nn.Module._replicate_for_data_parallel`` (a shallow copy of the instance ``__dict__``),
    then every method bound on ``module``'s instance rebound to the replica."""
    replica = type(module)._replicate_for_data_parallel(module)
    for name, value in list(replica.__dict__.items()):
        if isinstance(value, types.MethodType) and value.__self__ is module:
            replica.__dict__[name] = types.MethodType(value.__func__, replica)
    return replica


def _reduce(module: torch.nn.Module, protocol: int, *, fusion: str) -> tuple[Any, ...]:
    # the state goes third, after the module exists, so state that refers back to it still loads
    state = {k: v for k, v in module.__dict__.items() if k not in _PATCH_ATTRS}
    return _reconstruct, (type(module), fusion), state


def _reconstruct(cls: type, fusion: str) -> torch.nn.Module:
    """The module, before its state: its next ``__setstate__`` (pickle's BUILD, copy's
    ``_reconstruct``) is ``_patched_again``'s."""
    module = cls.__new__(cls)
    module.__dict__["__setstate__"] = functools.partial(_patched_again, module, fusion)
    return module


def _patched_again(module: torch.nn.Module, fusion: str, state: dict[str, Any]) -> None:
    del module.__dict__["__setstate__"]
    type(module).__setstate__(module, state)
    if fusion == rotary_fusion.FUSION:
        found, why = rotary_fusion.fusion_for(module)
        why = why or (None if found else "its forward calls no known rotary embedding")
        if why is None:
            rotary_fusion.apply(module)
    else:
        # ``blocks.fusion_for``'s other checks are of the unpatched children (patch() swapped them since)
        block = blocks.matching(module)
        why = ("its forward is no longer the one fused" if block is None or block.name != fusion
               else "the module has hooks" if hooked(module) else None)
        if why is None:
            blocks.apply(module, block)
    if why is None:
        keep(module, fusion)
    else:
        warnings.warn(f"xkernels: a {_cls_name(module)} saved patched ({fusion!r}) runs its own forward after "
                      f"loading: {why}", UserWarning, stacklevel=2)


def _cls_name(module: torch.nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def fused(model: torch.nn.Module) -> dict[str, str]:
    """``{qualified name: fusion}`` of ``model``'s modules that run a fused forward (patched, or
    loaded from a patched model's file)."""
    out = {}
    for name, module in model.named_modules():
        reduce = module.__dict__.get("__reduce_ex__")
        if isinstance(reduce, types.MethodType) and isinstance(reduce.__func__, functools.partial):
            out[name or "(root)"] = reduce.__func__.keywords["fusion"]
    return out
