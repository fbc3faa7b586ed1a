"""Attention masks for ``xkernels.patch``, decided while a graph is traced or captured as
transformers decides them in an eager call.

transformers' mask helpers (``masking_utils``) give SDPA no mask where the mask would be plain:
a causal one runs as SDPA's ``is_causal`` (its kernels skip the tiles above the diagonal), a full
bidirectional one as no mask. While ``torch.compile`` traces they cannot tell two things and build
the whole (batch, 1, queries, keys) tensor instead, which SDPA's fused kernels then apply to every
tile, the half above a causal diagonal included:

* **One sequence per row.** With no ``attention_mask`` and no cache, a decoder checks that its
  positions hold one sequence per row (``find_packed_sequence_indices``: packed sequences restart
  at 0 and need a block mask). Eager mode reads the positions (one host sync per call); a trace
  cannot, so it takes them as packed. But a model-level module that made the positions itself
  (``position_ids=None`` and its forward's ``if position_ids is None:`` fills them from
  ``arange``, not from a mask) made ``0 .. seq-1`` on every row: one sequence, read or not.
* **Exporting.** Dynamo on torch < 2.14 answers ``torch.compiler.is_exporting()`` ``True`` whenever
  it traces (fixed by pytorch#176499), and transformers never skips a mask while exporting. The
  flag ``torch.export`` itself sets, ``torch.compiler._is_exporting_flag``, is read as it is.

A module :func:`targets` finds (its forward, or a method it calls on ``self``, calls one of
:data:`CREATORS`) gets a forward pre-hook and an always-called forward hook that bracket its call
in a per-thread stack entry; while its call is on top, this module's replacements of
``masking_utils.find_packed_sequence_indices`` and ``masking_utils.is_torchdynamo_exporting``
answer as above, and outside any such call they are transformers' own. So a patched Llama, GPT-2,
Qwen2, Mistral, Gemma or Phi-3 under ``torch.compile`` (and a CUDA-graph capture, where the
positions cannot be read either) runs the causal kernels eager mode runs, where the unpatched
model runs the masked ones; an eager call skips the positions' host sync. A padding mask
(``attention_mask`` given) is read in eager mode and cannot be while tracing: it stays a
materialized mask there, as without xkernels. Positions the caller passed are checked as before.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import threading
from typing import Any

import torch

from xkernels.source_forms import function_node

__all__ = ["CREATORS", "FUSION", "NOTE", "apply", "decided_as_eager", "targets", "undo"]

#: transformers' mask creators (``masking_utils``) whose callers get the hooks
CREATORS = frozenset({"create_causal_mask", "create_sliding_window_causal_mask", "create_chunked_causal_mask",
                      "create_bidirectional_mask", "create_masks_for_generate"})
#: what ``patch()`` reports for a module given the hooks
FUSION = "attention masks decided as in eager mode"
#: its note in the report
NOTE = ("while torch.compile traces or a CUDA graph is captured, positions the module made itself count as one "
        "sequence per row and only torch.export as exporting, so a causal or full mask without padding runs as "
        "SDPA's is_causal / no mask, as in eager mode; a padding mask given is still built")

_POSITIONS = "position_ids"


class _Calls(threading.local):
    """Per thread: one entry per patched module call in progress, innermost last: whether that
    module made its positions itself."""

    def __init__(self) -> None:
        self.stack: list[bool] = []


_CALLS = _Calls()
#: transformers' own functions the replacements fall back to
_ORIGINALS: dict[str, Any] = {}


def decided_as_eager() -> bool:
    """Whether a patched module's call is in progress on this thread (the replacements answer as
    in eager mode)."""
    return bool(_CALLS.stack)


def find_packed_sequence_indices(position_ids: torch.Tensor) -> torch.Tensor | None:
    """``None`` (one sequence per row) inside a patched module's call that made its positions
    itself; transformers' own check otherwise."""
    stack = _CALLS.stack
    if stack and stack[-1]:
        return None
    return _ORIGINALS["find_packed_sequence_indices"](position_ids)


def is_torchdynamo_exporting() -> bool:
    """Inside a patched module's call, whether ``torch.export`` is exporting (the flag it sets);
    transformers' own answer otherwise."""
    if _CALLS.stack:
        flag = getattr(torch.compiler, "_is_exporting_flag", None)
        if isinstance(flag, bool):
            return flag
    return _ORIGINALS["is_torchdynamo_exporting"]()


_REPLACEMENTS = {"find_packed_sequence_indices": find_packed_sequence_indices,
                 "is_torchdynamo_exporting": is_torchdynamo_exporting}


def _install() -> bool:
    """The replacements in ``transformers.masking_utils`` (idempotent); ``False`` where that
    module lacks either function (another transformers version: nothing is changed)."""
    mu = sys.modules.get("transformers.masking_utils")
    if mu is None or not all(callable(getattr(mu, name, None)) for name in _REPLACEMENTS):
        return False
    for name, ours in _REPLACEMENTS.items():
        current = getattr(mu, name)
        if current is not ours:
            _ORIGINALS[name] = current
            setattr(mu, name, ours)
    return True


class _Enter:
    """The pre-hook: pushes whether the call left ``position_ids`` to the module (its positional
    index ``index``; ``None``: the module does not make them). Unpickled (a saved model loaded in
    another process, a copy) it installs the replacements, which ``patch()`` did in the process that
    saved it."""

    def __init__(self, index: int | None) -> None:
        self.index = index

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _install()

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        made = False
        index = self.index
        if index is not None:
            given = kwargs[_POSITIONS] if _POSITIONS in kwargs else (args[index] if len(args) > index else None)
            made = given is None
        _CALLS.stack.append(made)


def _leave(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    if _CALLS.stack:
        _CALLS.stack.pop()


def _calls_creator(node: ast.AST) -> bool:
    """Whether ``node`` names a creator: a call, or a choice between them (Mistral's
    ``mask_function = create_causal_mask if ... else create_sliding_window_causal_mask``)."""
    return any(isinstance(n, ast.Name) and n.id in CREATORS for n in ast.walk(node))


def _is_position_check(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == _POSITIONS
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None)


def _makes_positions(node: ast.FunctionDef) -> bool:
    """An ``if position_ids is None:`` whose body assigns ``position_ids`` from ``arange`` and reads
    no ``attention_mask`` (OPT's cumulative sum of the mask is not one sequence per row)."""
    for stmt in ast.walk(node):
        if not (isinstance(stmt, ast.If) and _is_position_check(stmt.test)):
            continue
        body = ast.Module(body=stmt.body, type_ignores=[])
        names = {n.id for n in ast.walk(body) if isinstance(n, ast.Name)}
        assigned = any(isinstance(t, ast.Name) and t.id == _POSITIONS
                       for a in ast.walk(body) if isinstance(a, ast.Assign) for t in a.targets)
        aranged = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "arange"
                      for c in ast.walk(body))
        if assigned and aranged and "attention_mask" not in names:
            return True
    return False


@functools.lru_cache(maxsize=256)
def _plan(cls: type) -> tuple[bool, int | None]:
    """(whether ``cls`` creates masks, the index of ``position_ids`` among its forward's
    positional arguments after ``self`` where its forward makes them itself, else ``None``)."""
    fn = getattr(cls, "forward", None)
    node = function_node(fn) if fn is not None else None
    if node is None:
        return False, None
    creates = _calls_creator(node)
    if not creates:  # one level down: a helper method the forward calls on self (BERT's _create_attention_masks)
        helpers = {c.func.attr for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                   and isinstance(c.func.value, ast.Name) and c.func.value.id == "self"}
        for name in sorted(helpers):
            helper = inspect.getattr_static(cls, name, None)
            helper_node = function_node(helper) if inspect.isfunction(helper) else None
            if helper_node is not None and _calls_creator(helper_node):
                creates = True
                break
    if not creates:
        return False, None
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return True, None
    if _POSITIONS not in params or not _makes_positions(node):
        return True, None
    return True, params.index(_POSITIONS) - 1


def targets(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, int | None]]:
    """``(qualified name, module, position index or None)`` of the modules :func:`apply` gives the
    hooks (module doc); none where transformers is not loaded or its ``masking_utils`` lacks the
    functions replaced."""
    mu = sys.modules.get("transformers.masking_utils")
    if mu is None or not all(callable(getattr(mu, name, None)) for name in _REPLACEMENTS):
        return []
    out = []
    for name, module in model.named_modules():
        if getattr(module, "_xkernels_mask_hooks", None) is not None:
            continue
        creates, index = _plan(type(module))
        if creates:
            out.append((name, module, index))
    return out


def apply(module: torch.nn.Module, index: int | None) -> None:
    """Give ``module`` the hooks (installing the replacements)."""
    if not _install():
        return
    pre = module.register_forward_pre_hook(_Enter(index), with_kwargs=True, prepend=True)
    post = module.register_forward_hook(_leave, always_call=True)
    module._xkernels_mask_hooks = (pre, post)


def undo(module: torch.nn.Module) -> None:
    """The module without the hooks (the replacements stay: outside a hooked call they are
    transformers' own functions)."""
    handles = module.__dict__.pop("_xkernels_mask_hooks", None)
    for handle in handles or ():
        handle.remove()
