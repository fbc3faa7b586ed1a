"""Gated MLP forwards, whatever their names: ``gated_form(cls)`` reads ``cls.forward``'s source and
says whether it computes ``act(gate(x)) * up(x)`` from its one input, then applies only calls of
``self``'s attributes (a down-projection, dropouts, a norm), ``torch.nn.functional.dropout`` or
T5's cast to the product.

Written any way the source likes: one expression or through locals (``gate = ...; up = ...``,
the input's name reused), the product's factors in either order, any child names (``gate_proj``
/ ``up_proj`` / ``down_proj``, ``wi_0`` / ``wi_1`` / ``wo``, ...). So a dropout between the
product and the down-projection (GTE, T5Gemma), after it (Seed-OSS's ``nn.functional.dropout(y,
p=self.residual_dropout, training=self.training)``), a norm before it (BitNet), and T5's cast of
the product to the down-projection's weight dtype (T5 v1.1, mT5, UMT5, Pix2Struct, UDOP, ...)
are all this form. Anything else (a clamp, a scale, a second use of a value, another argument, a
branch) is not, and the module keeps its forward.

This module only reads sources; whether the children can take the fused op is decided on the
module (``xkernels.blocks``), since a name says nothing of a child's type. Nothing here imports
the ops.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from xkernels.source_forms import function_node, without_docstring

__all__ = ["GatedForm", "gated_form"]


@dataclass(frozen=True)
class GatedForm:
    """What a gated MLP forward does, by child name."""

    #: the projections: (gate, up), the activation applied to the first's output; or (gate_up,), one
    #: projection whose output is chunked in two halves (Phi-3, GLM, ModernBERT, Granite)
    proj: tuple[str, ...]
    act: str  # the activation module
    #: what is applied to the product, innermost first: ``("module", child)`` (the down-projection,
    #: a dropout, a norm: any child, called as the forward calls it) or ``("dropout", attr)``
    #: (``F.dropout(y, p=self.<attr>, training=self.training)``) or ``("cast", child)`` (T5's: to
    #: the child's weight dtype where it differs and is not int8)
    chain: tuple[tuple[str, str], ...]
    #: one projection: whether the activation takes its first half (Phi-3's ``gate, up = ...chunk``);
    #: else its second (ModernBERT's is first; Dia's and Zamba2's ``up, gate``-ordered ones second)
    gate_first: bool = True

    def modules(self) -> tuple[str, ...]:
        """The children the chain calls, innermost first."""
        return tuple(name for kind, name in self.chain if kind == "module")


def _self_attr(e: ast.expr) -> str | None:
    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
        return e.attr
    return None


def _child_call(e: ast.expr) -> tuple[str, ast.expr] | None:
    """``self.<name>(arg)`` with one positional argument: (name, arg)."""
    if isinstance(e, ast.Call) and len(e.args) == 1 and not e.keywords and not isinstance(e.args[0], ast.Starred):
        name = _self_attr(e.func)
        if name is not None:
            return name, e.args[0]
    return None


def _dotted(e: ast.expr) -> list[str] | None:
    if isinstance(e, ast.Name):
        return [e.id]
    if isinstance(e, ast.Attribute):
        base = _dotted(e.value)
        return None if base is None else [*base, e.attr]
    return None


def _resolve(e: ast.expr, scope: dict[str, Any]) -> Any:
    """The object a dotted name (``nn.functional.dropout``, ``F.dropout``) is in ``scope``."""
    parts = _dotted(e)
    if not parts or parts[0] not in scope:
        return None
    obj = scope[parts[0]]
    for p in parts[1:]:
        obj = getattr(obj, p, None)
    return obj


def _functional_dropout(e: ast.expr, scope: dict[str, Any]) -> tuple[str, ast.expr] | None:
    """``F.dropout(y, p=self.<attr>, training=self.training)`` (positional or keyword; ``inplace``
    absent or ``False``): (attr, y)."""
    if not isinstance(e, ast.Call) or _resolve(e.func, scope) is not torch.nn.functional.dropout:
        return None
    params = ("input", "p", "training", "inplace")
    if len(e.args) > len(params) or any(isinstance(a, ast.Starred) for a in e.args):
        return None
    bound = dict(zip(params, e.args))
    for kw in e.keywords:
        if kw.arg is None or kw.arg not in params or kw.arg in bound:
            return None
        bound[kw.arg] = kw.value
    p, training, inplace = bound.get("p"), bound.get("training"), bound.get("inplace")
    if "input" not in bound or p is None or _self_attr(p) is None or _self_attr(training) != "training":
        return None
    if inplace is not None and not (isinstance(inplace, ast.Constant) and inplace.value is False):
        return None
    return _self_attr(p), bound["input"]


#: marker calls the reader puts in place of what it recognised: a chunk of a value in two halves,
#: one of its halves (``<half 0>`` / ``<half 1>``), the cast to a weight's dtype (``_CAST``)
_CHUNK, _HALF = "<chunk in two>", "<half {}>"


def _marker(name: str, arg: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(name, ast.Load()), [arg], [])


def _marked(e: ast.expr, name: str) -> ast.expr | None:
    """The argument of a marker call named ``name``, else ``None``."""
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == name:
        return e.args[0]
    return None


def _chunked(e: ast.expr, scope: dict[str, Any]) -> ast.expr | None:
    """``v.chunk(2, dim=-1)`` / ``v.chunk(2, -1)`` / ``torch.chunk(v, 2, dim=-1)``: ``v``."""
    if not isinstance(e, ast.Call) or any(isinstance(a, ast.Starred) for a in e.args):
        return None
    if isinstance(e.func, ast.Attribute) and e.func.attr == "chunk" and _resolve(e.func, scope) is None:
        value, args = e.func.value, list(e.args)
    elif _resolve(e.func, scope) is torch.chunk and e.args:
        value, args = e.args[0], list(e.args[1:])
    else:
        return None
    dims = [kw.value for kw in e.keywords if kw.arg == "dim"]
    if len(e.keywords) != len(dims) or len(args) + len(dims) != 2:
        return None
    try:
        n, dim = ast.literal_eval(args[0]), ast.literal_eval((args[1:] or dims)[0])
    except (ValueError, TypeError, SyntaxError):
        return None
    return value if (n, dim) == (2, -1) else None


class _Inliner(ast.NodeTransformer):
    """Locals replaced by what was assigned to them; a value used twice (computed twice, or kept)
    makes the forward something else (``failed``). A chunk's halves are used once each."""

    def __init__(self, env: dict[str, ast.expr], used: set[Any]) -> None:
        self.env, self.used, self.failed = env, used, False

    def _use(self, key: Any) -> None:
        if key in self.used:
            self.failed = True
        self.used.add(key)

    def visit_Name(self, node: ast.Name) -> ast.expr:
        value = self.env.get(node.id)
        if value is None:
            return node
        if _marked(value, _CHUNK) is not None:  # a chunk is read by its halves only (visit_Subscript)
            self.failed = True
        self._use(id(value))
        return value

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        value = self.env.get(node.value.id) if isinstance(node.value, ast.Name) else None
        whole = _marked(value, _CHUNK) if value is not None else None
        if whole is None:
            return self.generic_visit(node)
        index = node.slice.value if isinstance(node.slice, ast.Constant) else None
        if index not in (0, 1):
            self.failed = True
            return node
        self._use((id(value), index))
        self.used.add(id(value))
        return _marker(_HALF.format(index), whole)


#: T5's cast of the product to the down-projection's weight dtype before it (kept in fp32 for 8-bit
#: Flan-T5-XXL), with the child and the local filled in
_CAST_TO_WEIGHT = """
if isinstance(self.{m}.weight, torch.Tensor) and {v}.dtype != self.{m}.weight.dtype and self.{m}.weight.dtype != torch.int8:
    {v} = {v}.to(self.{m}.weight.dtype)
"""
#: the name of the marker call a matched cast becomes while the forward is read
_CAST = "<cast to the weight dtype of>"


def _cast_to_weight(st: ast.stmt, scope: dict[str, Any]) -> tuple[str, str] | None:
    """(child, local) of an ``if`` statement that is ``_CAST_TO_WEIGHT``."""
    if not (isinstance(st, ast.If) and len(st.body) == 1 and isinstance(st.body[0], ast.Assign)
            and scope.get("torch") is torch):
        return None
    assign = st.body[0]
    try:
        v = assign.targets[0].id  # type: ignore[attr-defined]
        m = assign.value.args[0].value.value.attr  # type: ignore[attr-defined]
    except (AttributeError, IndexError):
        return None
    want = ast.parse(_CAST_TO_WEIGHT.format(m=m, v=v)).body[0]
    return (m, v) if ast.dump(st, include_attributes=False) == ast.dump(want, include_attributes=False) else None


def _product(e: ast.expr, x: str) -> tuple[tuple[str, ...], str, bool] | None:
    """``self.<act>(self.<gate>(x)) * self.<up>(x)``, or ``self.<act>(h0) * h1`` of the halves of
    ``self.<gate_up>(x)``, either order: (projections, activation, gate first)."""
    if not (isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult)):
        return None
    for a, u in ((e.left, e.right), (e.right, e.left)):
        outer = _child_call(a)
        if outer is None:
            continue
        gated, up = outer[1], u
        inner, other = _child_call(gated), _child_call(up)
        if inner is not None and other is not None:  # two projections
            if all(isinstance(arg, ast.Name) and arg.id == x for arg in (inner[1], other[1])):
                return (inner[0], other[0]), outer[0], True
            continue
        for i in (0, 1):  # the halves of one projection's output
            whole, rest = _marked(gated, _HALF.format(i)), _marked(up, _HALF.format(1 - i))
            if whole is not None and whole is rest:
                proj = _child_call(whole)
                if proj is not None and isinstance(proj[1], ast.Name) and proj[1].id == x:
                    return (proj[0],), outer[0], i == 0
    return None


@cache
def gated_form(cls: type) -> GatedForm | None:
    """``cls.forward`` as a :class:`GatedForm`, or ``None`` where it is anything else (module doc)."""
    fn = getattr(cls, "forward", None)
    node = function_node(fn)
    if node is None:
        return None
    a = node.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults or len(a.args) != 2:
        return None
    x = a.args[1].arg
    body = without_docstring(node.body)
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    env: dict[str, ast.expr] = {}
    used: set[Any] = set()
    scope = getattr(fn, "__globals__", {})
    bound = 0  # values bound to locals: each must be used
    for st in body[:-1]:
        cast = _cast_to_weight(st, scope)
        if cast is not None and cast[1] in env:
            m, v = cast
            used.add(id(env[v]))
            env[v] = _marker(_CAST + m, env[v])
            bound += 1
            continue
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
            return None
        target, inliner = st.targets[0], _Inliner(env, used)
        value = inliner.visit(st.value)
        if inliner.failed:
            return None
        whole = _chunked(value, scope)
        if isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(
                isinstance(t, ast.Name) for t in target.elts) and whole is not None:  # a, b = v.chunk(2, dim=-1)
            for i, t in enumerate(target.elts):
                env[t.id] = _marker(_HALF.format(i), whole)  # type: ignore[attr-defined]
            bound += 2
            continue
        if not isinstance(target, ast.Name):
            return None
        env[target.id] = _marker(_CHUNK, whole) if whole is not None else value
        bound += 1
    inliner = _Inliner(env, used)
    e = inliner.visit(body[-1].value)
    if inliner.failed or len({u for u in used if not isinstance(u, tuple)}) != bound:  # a value left unused
        return None
    chain: list[tuple[str, str]] = []
    while (found := _product(e, x)) is None:
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id.startswith(_CAST):
            chain.append(("cast", e.func.id[len(_CAST):]))
            e = e.args[0]
            continue
        call = _child_call(e)
        if call is not None:
            chain.append(("module", call[0]))
            e = call[1]
            continue
        drop = _functional_dropout(e, scope)
        if drop is None:
            return None
        chain.append(("dropout", drop[0]))
        e = drop[1]
    proj, act, gate_first = found
    if len({*proj, act}) != len(proj) + 1 or {*proj, act} & {n for k, n in chain if k == "module"}:
        return None  # a projection or the activation used twice
    return GatedForm(proj, act, tuple(reversed(chain)), gate_first)
