"""Residual adds followed by a norm, inside any forward: ``add_norm_form(cls, helper, helper_sum)``
reads ``cls.forward``'s source, finds the add + norm sites and makes the same forward with each
site calling a fused helper instead, whatever the children are called:

* post-norm, the sum read nowhere else: ``self.<norm>(a + b)``, and ``h = a + b`` then
  ``h = self.<norm>(h)`` (the sum's name rebound by the norm) become ``helper(self, "<norm>", a,
  b)``: BART's and its copies' encoder and decoder layers, DistilBERT, GTE, wav2vec2 and HuBERT,
  DETR, ...;
* pre-norm, the sum kept as the next residual: ``s = a + b`` then ``t = self.<norm>(s)``, or with
  the sum aliased in between (``s = a + b; residual = s; s = self.<norm>(s)``), become
  ``s, t = helper_sum(self, "<norm>", a, b)`` (the alias assigned the sum): Whisper's, mBART's,
  Pegasus', M2M-100's, BioGPT's, Moonshine's layers and every other forward written the way
  transformers writes a pre-norm layer it does not share with Llama.

The new function is compiled from the rewritten source in a copy of the original's globals, its
line numbers those of the original file (a traceback points at the model's source). Nothing else
changes: the operands are evaluated in the source's order and every other statement is the
original's. A forward that cannot be made again this way is left alone: a decorated one (other
than transformers' gradient checkpointing wrapper, made again around the new one), one that calls
``super()`` (no ``__class__`` cell) or one whose source cannot be read. Which sites fuse
is decided per call by the helpers (``xkernels.block_steps.add_then_norm`` and
``add_norm_and_sum``): the norm's kind, the operands' shapes and dtypes. This module only reads
and rewrites sources.
"""

from __future__ import annotations

import ast
import copy
import inspect
from collections.abc import Callable
from functools import cache
from typing import Any, NamedTuple

from xkernels.source_forms import drop_annotations, first_function, located_tree

__all__ = ["HELPER", "HELPER_SUM", "AddNormForm", "add_norm_form"]

#: the global names the rewritten forward calls the helpers by (the norm's output; the sum and it)
HELPER = "_xkernels_add_then_norm"
HELPER_SUM = "_xkernels_add_norm_and_sum"


class AddNormForm(NamedTuple):
    """A rewritten forward and its sites' norm children, each in order of first appearance."""

    forward: Callable[..., Any]
    plain: tuple[str, ...]  # the norms of the sites whose sum is read nowhere else (post-norm)
    summed: tuple[str, ...]  # the norms of the sites that keep the sum (pre-norm)

    @property
    def norms(self) -> tuple[str, ...]:
        """Every site's norm."""
        return tuple(dict.fromkeys((*self.plain, *self.summed)))


def _norm_call(e: ast.expr) -> str | None:
    """``self.<name>(one argument)``: the name."""
    if (isinstance(e, ast.Call) and len(e.args) == 1 and not e.keywords and isinstance(e.func, ast.Attribute)
            and isinstance(e.func.value, ast.Name) and e.func.value.id == "self"
            and not isinstance(e.args[0], ast.Starred)):
        return e.func.attr
    return None


def _helper_call(name: str, a: ast.expr, b: ast.expr, helper: str = HELPER) -> ast.Call:
    return ast.Call(ast.Name(helper, ast.Load()),
                    [ast.Name("self", ast.Load()), ast.Constant(name), a, b], [])


def _name_assign(st: ast.stmt | None) -> str | None:
    """``<name> = <expression>``: the name."""
    if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
        return st.targets[0].id
    return None


def _norm_of(st: ast.stmt | None, arg: str) -> str | None:
    """``<name> = self.<norm>(<arg>)``: the norm's child name."""
    if _name_assign(st) is None:
        return None
    name = _norm_call(st.value)  # type: ignore[union-attr]
    call_arg = st.value.args[0] if name is not None else None  # type: ignore[union-attr]
    return name if isinstance(call_arg, ast.Name) and call_arg.id == arg else None


def _store(name: str) -> ast.Name:
    return ast.Name(name, ast.Store())


def _sum_name(st: ast.stmt | None) -> str | None:
    """``<name> = a + b``: the name."""
    s = _name_assign(st)
    return s if s is not None and isinstance(st.value, ast.BinOp) and isinstance(st.value.op, ast.Add) else None  # type: ignore[union-attr]


def _site(body: list[ast.stmt], j: int, s: str) -> tuple[str, str, str | None, int] | None:
    """The norm of the sum ``s`` at ``body[j:]``: ``t = self.<norm>(s)``, or ``r = s`` then
    ``t = self.<norm>(s)``; as ``(norm, t, r or None, statements)``."""
    nxt, third = (body[k] if k < len(body) else None for k in (j, j + 1))
    if (name := _norm_of(nxt, s)) is not None:
        return name, _name_assign(nxt), None, 1  # type: ignore[return-value]
    value = getattr(nxt, "value", None)
    alias = _name_assign(nxt) if isinstance(value, ast.Name) and value.id == s else None
    if alias is not None and alias != s and (name := _norm_of(third, s)) is not None \
            and _name_assign(third) != alias:
        return name, _name_assign(third), alias, 2  # type: ignore[return-value]
    return None


def _plain(e: ast.expr, s: str) -> bool:
    """Whether evaluating ``e`` before ``s = a + b`` (of names) is the same as after: it reads no
    ``s`` and calls, awaits or assigns nothing."""
    return not any(isinstance(n, (ast.Call, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda))
                   or isinstance(n, ast.Name) and n.id == s for n in ast.walk(e))


def _add_into_branch(st: ast.Assign, s: str, nxt: ast.stmt | None) -> ast.If | None:
    """``s = a + b`` then ``if c:`` (no ``else``) whose body starts with the sum's norm (mBART's and
    Whisper's decoder layers: the self-attention's residual add, then the cross-attention block's
    norm where there is an encoder): the add moved into the body and into a new ``else``, so the
    site is in one list. Only where ``a``, ``b`` are names and ``c`` reads no ``s`` and calls
    nothing (its value and the add's are the same in either order)."""
    v = st.value
    if (not isinstance(nxt, ast.If) or nxt.orelse or not all(isinstance(x, ast.Name) for x in (v.left, v.right))  # type: ignore[attr-defined]
            or not _plain(nxt.test, s) or _site(nxt.body, 0, s) is None):
        return None
    return ast.copy_location(ast.If(nxt.test, [st, *nxt.body], [copy.deepcopy(st)]), nxt)


def _site_into_branches(st: ast.If, body: list[ast.stmt], j: int) -> tuple[ast.If, int] | None:
    """``if c:`` whose branches each end with ``s = a + b`` (a missing ``else`` counts as one that
    leaves ``s`` as it was), followed by the sum's norm: the norm's statements appended to each
    branch (a missing ``else`` made of them alone), so each branch's add meets it; and the number
    of statements moved."""
    ends = [_sum_name(branch[-1]) for branch in (st.body, st.orelse) if branch]
    s = ends[0]
    if s is None or any(e != s for e in ends) or (site := _site(body, j, s)) is None:
        return None
    tail = body[j:j + site[3]]
    return ast.copy_location(ast.If(st.test, [*st.body, *copy.deepcopy(tail)],
                                    [*st.orelse, *copy.deepcopy(tail)]), st), site[3]


class _Sites(ast.NodeTransformer):
    """Rewrites each site; ``norms``: the child names, in order of first appearance."""

    def __init__(self) -> None:
        self.plain: list[str] = []
        self.summed: list[str] = []

    def _found(self, name: str, summed: bool = False) -> None:
        names = self.summed if summed else self.plain
        if name not in names:
            names.append(name)

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        name = _norm_call(node)
        arg = node.args[0] if name is not None else None
        if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):  # self.<norm>(a + b)
            self._found(name)  # type: ignore[arg-type]
            return ast.copy_location(_helper_call(name, arg.left, arg.right), node)  # type: ignore[arg-type]
        return node

    def _statements(self, body: list[ast.stmt]) -> list[ast.stmt]:
        body = list(body)
        out: list[ast.stmt] = []
        i = 0
        while i < len(body):
            st = body[i]
            s = _sum_name(st)
            if s is not None and (site := _site(body, i + 1, s)) is not None:
                self._fuse(out, st, s, *site[:3])
                i += 1 + site[3]
                continue
            if s is not None and (moved := _add_into_branch(st, s, body[i + 1] if i + 1 < len(body) else None)):
                body[i:i + 2] = [moved]  # scanned again: its branches now start with the site
                continue
            if isinstance(st, ast.If) and (joined := _site_into_branches(st, body, i + 1)) is not None:
                st, used = joined
                out.append(self.visit(st))
                i += 1 + used
                continue
            out.append(self.visit(st))
            i += 1
        return out

    def _fuse(self, out: list[ast.stmt], st: ast.Assign, s: str, name: str, target: str, alias: str | None) -> None:
        """The site ``s = a + b`` (``st``), ``[alias = s]``, ``target = self.<name>(s)`` as one call."""
        a, b = self.visit(st.value.left), self.visit(st.value.right)  # type: ignore[attr-defined]
        if target == s and alias is None:  # post-norm: the sum's name rebound by the norm
            self._found(name)
            out.append(ast.copy_location(ast.Assign([_store(s)], _helper_call(name, a, b)), st))
            return
        self._found(name, summed=True)  # the sum kept: under its own name, or the alias's where the norm rebinds it
        kept = alias if target == s else s
        pair = ast.Tuple([_store(kept), _store(target)], ast.Store())  # type: ignore[list-item]
        out.append(ast.copy_location(ast.Assign([pair], _helper_call(name, a, b, HELPER_SUM)), st))
        if alias is not None and target != s:
            out.append(ast.copy_location(ast.Assign([_store(alias)], ast.Name(s, ast.Load())), st))


    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                setattr(node, field, self._statements(stmts))
        for field, value in ast.iter_fields(node):
            if field in ("body", "orelse", "finalbody") and isinstance(value, list) and value \
                    and isinstance(value[0], ast.stmt):
                continue
            if isinstance(value, list):
                setattr(node, field, [self.visit(v) if isinstance(v, ast.AST) else v for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, field, self.visit(value))
        return node


@cache
def add_norm_form(cls: type, helper: Callable[..., Any], helper_sum: Callable[..., Any]) -> AddNormForm | None:
    """``cls.forward`` with its add + norm sites calling ``helper`` (post-norm) and ``helper_sum``
    (pre-norm), with the sites' norm children, or ``None`` (no site, or a forward this cannot make
    again: module doc)."""
    fn = getattr(cls, "forward", None)
    if inspect.isfunction(fn) and fn.__code__.co_freevars == ("forward", "forward_with_checkpointing"):
        fn = getattr(fn, "__wrapped__", None)  # transformers' GradientCheckpointingLayer wrapper (made again
        # around the rewritten forward by ``xkernels.block_steps.checkpointed``)
    if not inspect.isfunction(fn) or hasattr(fn, "__wrapped__") or fn.__code__.co_freevars:
        return None
    located = located_tree(fn)
    if located is None:
        return None
    tree, first, filename = located
    node = first_function(tree)
    if node is None or node.decorator_list or any(
            isinstance(n, ast.Name) and n.id in ("super", "__class__", HELPER, HELPER_SUM) for n in ast.walk(node)):
        return None
    drop_annotations(node)  # annotations are not evaluated again (a name only imported for type checking)
    sites = _Sites()
    node.body = sites._statements(node.body)
    if not sites.plain and not sites.summed:
        return None
    ast.increment_lineno(tree, first - 1)
    ast.fix_missing_locations(tree)
    scope = dict(fn.__globals__)
    scope[HELPER], scope[HELPER_SUM] = helper, helper_sum
    try:
        exec(compile(tree, filename, "exec"), scope)  # noqa: S102 (the class's own source, rewritten)
    except Exception:  # a source this cannot make again: the forward stays the class's own
        return None
    new = scope[node.name]
    new.__defaults__, new.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    new.__qualname__, new.__module__ = fn.__qualname__, fn.__module__
    return AddNormForm(new, tuple(sites.plain), tuple(sites.summed))
