"""Where a module's forward applies an activation module straight to a linear layer's output, read
from its source: the pairs ``xkernels.patch`` fuses (rule 1) in classes it was never told about.

``data/patch_patterns.json`` names the classes whose forward is ``act(dense(x))`` (BERT's
intermediate, GPT-2's MLP, ...). Many more write the same inline, in a larger forward: OPT's decoder
layer runs ``h = self.fc1(h)`` then ``h = self.activation_fn(h)``. A pair ``(linear, activation)``
of ``forward(self, ...)`` is read here when either

* one statement applies both: ``self.act(self.lin(...))`` (assigned, returned or as an argument);
* a statement ``v = self.lin(...)`` is followed directly by ``v = self.act(v)`` (the same name
  both times, so the pre-activation is never read again);

and each of ``self.lin`` and ``self.act`` occurs nowhere else in the forward (a second use of the
layer would get the activation too; a second use of the activation would lose it), nor is read by
any other method of the class or its bases (an ``__init__`` assigning them aside). Code outside
the class that calls ``module.fc1`` itself is not seen: the same holds for the classes
``patch_patterns.json`` lists. Whether the
attributes are a linear layer and a recognised activation is ``patch``'s to check on the instance.
A forward whose source cannot be read has no pairs. Decorators (transformers' ``deprecate_kwarg``,
``can_return_tuple``, ...) wrap a forward without changing which module is applied to what.
"""

from __future__ import annotations

import ast
import collections
import inspect
from functools import lru_cache

from xkernels.source_forms import function_node


def _self_call(node: ast.AST) -> tuple[str, ast.Call] | None:
    """``(attr, call)`` for ``self.<attr>(...)``."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
        return node.func.attr, node
    return None


def _nested(node: ast.AST) -> list[tuple[str, str]]:
    """``self.act(self.lin(...))`` anywhere under ``node``."""
    found = []
    for n in ast.walk(node):
        outer = _self_call(n)
        if outer and len(outer[1].args) == 1 and not outer[1].keywords:
            inner = _self_call(outer[1].args[0])
            if inner:
                found.append((inner[0], outer[0]))
    return found


def _adjacent(body: list[ast.stmt]) -> list[tuple[str, str]]:
    """``v = self.lin(...)`` directly followed by ``v = self.act(v)``, in one statement list."""
    found = []
    for a, b in zip(body, body[1:]):
        if not (isinstance(a, ast.Assign) and isinstance(b, ast.Assign) and len(a.targets) == len(b.targets) == 1):
            continue
        ta, tb = a.targets[0], b.targets[0]
        lin, act = _self_call(a.value), _self_call(b.value)
        if (lin and act and isinstance(ta, ast.Name) and isinstance(tb, ast.Name) and ta.id == tb.id
                and len(act[1].args) == 1 and not act[1].keywords
                and isinstance(act[1].args[0], ast.Name) and act[1].args[0].id == ta.id):
            found.append((lin[0], act[0]))
    return found


def pairs_of(fn: ast.FunctionDef) -> tuple[tuple[str, str], ...]:
    """The module doc's pairs of one parsed forward."""
    uses = collections.Counter(n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                               and isinstance(n.value, ast.Name) and n.value.id == "self")
    found = _nested(fn)
    for node in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                found += _adjacent(body)
    out = []
    for lin, act in found:
        if lin != act and uses[lin] == 1 and uses[act] == 1 and (lin, act) not in out:
            out.append((lin, act))
    return tuple(out)


def _read_elsewhere(cls: type, forward: object) -> collections.Counter | None:
    """How often each ``self.<attr>`` is read in the methods of ``cls`` and its bases below
    ``nn.Module`` other than ``forward`` (a helper that other code calls, reading ``self.fc1``,
    would see the fused layer); ``None`` where a method's source cannot be read."""
    import torch

    reads: collections.Counter = collections.Counter()
    mro = cls.__mro__
    seen: set[str] = set()
    for c in mro[:mro.index(torch.nn.Module)] if torch.nn.Module in mro else mro:
        for name, value in vars(c).items():
            if name in seen:  # overridden below: the instance runs the subclass's
                continue
            seen.add(name)
            fn = value.__func__ if isinstance(value, staticmethod | classmethod) else value
            if not inspect.isfunction(fn) or fn is forward:
                continue
            node = function_node(fn)
            if node is None:
                return None
            reads.update(n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
                         and isinstance(n.value, ast.Name) and n.value.id == "self")
    return reads


@lru_cache(maxsize=512)
def linear_activation_pairs(cls: type) -> tuple[tuple[str, str], ...]:
    """``(linear attribute, activation attribute)`` pairs of ``cls.forward`` (module doc), where no
    other method of the class reads either attribute."""
    forward = getattr(cls, "forward", None)
    fn = function_node(forward)
    if fn is None:
        return ()
    pairs = pairs_of(fn)
    if not pairs:
        return ()
    elsewhere = _read_elsewhere(cls, forward)
    if elsewhere is None:
        return ()
    return tuple((lin, act) for lin, act in pairs if not elsewhere[lin] and not elsewhere[act])
