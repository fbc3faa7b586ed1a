"""Residual adds followed by a norm, inside any forward: ``add_norm_form(cls, helper)`` reads
``cls.forward``'s source, finds each ``self.<norm>(a + b)`` and each pair of statements
``h = a + b`` then ``h = self.<norm>(h)`` (the sum's name rebound by the norm, so the sum is read
nowhere else), and makes the same forward with each site calling ``helper(self, "<norm>", a, b)``
instead: post-norm layers written inline (BART's and its copies' encoder and decoder layers,
DistilBERT, GTE, wav2vec2 and HuBERT, DETR, ...), whatever the children are called.

The new function is compiled from the rewritten source in a copy of the original's globals, its
line numbers those of the original file (a traceback points at the model's source). Nothing else
changes: the operands are evaluated in the source's order and every other statement is the
original's. A forward that cannot be made again this way is left alone: a decorated one (other
than transformers' gradient checkpointing wrapper, made again around the new one), one that calls
``super()`` (no ``__class__`` cell) or one whose source cannot be read. Which sites fuse
is decided per call by ``helper`` (``xkernels.block_steps.add_then_norm``): the norm's kind, the
operands' shapes and dtypes. This module only reads and rewrites sources.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from functools import cache
from typing import Any

__all__ = ["HELPER", "add_norm_form"]

#: the global name the rewritten forward calls the helper by
HELPER = "_xkernels_add_then_norm"


def _norm_call(e: ast.expr) -> str | None:
    """``self.<name>(one argument)``: the name."""
    if (isinstance(e, ast.Call) and len(e.args) == 1 and not e.keywords and isinstance(e.func, ast.Attribute)
            and isinstance(e.func.value, ast.Name) and e.func.value.id == "self"
            and not isinstance(e.args[0], ast.Starred)):
        return e.func.attr
    return None


def _helper_call(name: str, a: ast.expr, b: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(HELPER, ast.Load()),
                    [ast.Name("self", ast.Load()), ast.Constant(name), a, b], [])


class _Sites(ast.NodeTransformer):
    """Rewrites each site; ``norms``: the child names, in order of first appearance."""

    def __init__(self) -> None:
        self.norms: list[str] = []

    def _found(self, name: str) -> None:
        if name not in self.norms:
            self.norms.append(name)

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        name = _norm_call(node)
        arg = node.args[0] if name is not None else None
        if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):  # self.<norm>(a + b)
            self._found(name)  # type: ignore[arg-type]
            return ast.copy_location(_helper_call(name, arg.left, arg.right), node)  # type: ignore[arg-type]
        return node

    def _statements(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        i = 0
        while i < len(body):
            st, nxt = body[i], body[i + 1] if i + 1 < len(body) else None
            # h = a + b; h = self.<norm>(h)
            if (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                    and isinstance(st.value, ast.BinOp) and isinstance(st.value.op, ast.Add)
                    and isinstance(nxt, ast.Assign) and len(nxt.targets) == 1 and isinstance(nxt.targets[0], ast.Name)
                    and nxt.targets[0].id == st.targets[0].id and (name := _norm_call(nxt.value)) is not None
                    and isinstance(nxt.value.args[0], ast.Name) and nxt.value.args[0].id == st.targets[0].id):
                self._found(name)
                a, b = self.visit(st.value.left), self.visit(st.value.right)
                out.append(ast.copy_location(ast.Assign([nxt.targets[0]], _helper_call(name, a, b)), st))
                i += 2
                continue
            out.append(self.visit(st))
            i += 1
        return out

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
def add_norm_form(cls: type, helper: Callable[..., Any]) -> tuple[Callable[..., Any], tuple[str, ...]] | None:
    """``cls.forward`` with its add + norm sites calling ``helper`` and the norms' child names, or
    ``None`` (no site, or a forward this cannot make again: module doc)."""
    fn = getattr(cls, "forward", None)
    if inspect.isfunction(fn) and fn.__code__.co_freevars == ("forward", "forward_with_checkpointing"):
        fn = getattr(fn, "__wrapped__", None)  # transformers' GradientCheckpointingLayer wrapper (made again
        # around the rewritten forward by ``xkernels.block_steps.checkpointed``)
    if not inspect.isfunction(fn) or hasattr(fn, "__wrapped__") or fn.__code__.co_freevars:
        return None
    try:
        lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        filename = inspect.getsourcefile(fn) or "<unknown>"
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef) or node.decorator_list or any(
            isinstance(n, ast.Name) and n.id in ("super", "__class__", HELPER) for n in ast.walk(node)):
        return None
    args = node.args  # annotations are not evaluated again (a name only imported for type checking)
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    node.returns = None
    sites = _Sites()
    node.body = sites._statements(node.body)
    if not sites.norms:
        return None
    ast.increment_lineno(tree, first - 1)
    ast.fix_missing_locations(tree)
    scope = dict(fn.__globals__)
    scope[HELPER] = helper
    try:
        exec(compile(tree, filename, "exec"), scope)  # noqa: S102 (the class's own source, rewritten)
    except Exception:  # a source this cannot make again: the forward stays the class's own
        return None
    new = scope[node.name]
    new.__defaults__, new.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    new.__qualname__, new.__module__ = fn.__qualname__, fn.__module__
    return new, tuple(sites.norms)
