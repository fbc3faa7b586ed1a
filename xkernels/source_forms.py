"""A function's source as an AST, for the modules that recognise a forward by its source:
``blocks``, ``add_norm_forms``, ``gated_forms``, ``linear_forms``, ``activation_forms`` and
``rotary_fusion``.

The source is ``inspect``'s, dedented (a method's ``def`` is indented in its class) and parsed.
Where it cannot be read (a builtin or C function, a function or class made by ``exec``, anything
``inspect`` does not take, ``None``) or does not parse, the readers give ``None`` and the caller
leaves the module as it is; :func:`function_node` also gives ``None`` where the source is not a
``def`` (a lambda's line). Nothing is cached: callers rewrite the nodes they get, and cache their
own results per class. Only the standard library is imported.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Located", "canonical", "drop_annotations", "first_function", "function_node", "located_tree",
           "parse_source", "source_tree", "without_docstring"]

#: what reading or parsing a source raises where it cannot be had (IndentationError is a SyntaxError)
_UNREADABLE = (OSError, TypeError, SyntaxError)


class Located(NamedTuple):
    """A function's parsed source with where it came from (to compile a rewritten copy whose line
    numbers are the original file's)."""

    tree: ast.Module
    first: int  # the line number of the source's first line in its file
    filename: str


def parse_source(source: str) -> ast.Module | None:
    """``source`` dedented and parsed, or ``None`` where it does not parse."""
    try:
        return ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None


def source_tree(fn: Any) -> ast.Module | None:
    """``fn``'s source dedented and parsed, or ``None`` (module doc). A string is not a source here:
    ``inspect`` does not take it."""
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except _UNREADABLE:
        return None


def located_tree(fn: Any) -> Located | None:
    """:func:`source_tree` with the first line number and the file name (``"<unknown>"`` where
    ``inspect`` finds none), or ``None``."""
    try:
        lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        filename = inspect.getsourcefile(fn) or "<unknown>"
    except _UNREADABLE:
        return None
    return Located(tree, first, filename)


def first_function(tree: ast.Module | None) -> ast.FunctionDef | None:
    """The tree's first statement where it is a ``def`` (not ``async def``), else ``None``."""
    node = tree.body[0] if tree is not None and tree.body else None
    return node if isinstance(node, ast.FunctionDef) else None


def function_node(fn: Any) -> ast.FunctionDef | None:
    """``fn``'s ``def`` node (decorators included), or ``None`` (module doc; also where the source
    is not a ``def``)."""
    return first_function(source_tree(fn))


def without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` without a leading docstring (any constant expression statement); ``body`` itself
    where it has none."""
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[1:]
    return body


def drop_annotations(fn: ast.FunctionDef) -> None:
    """Removes ``fn``'s argument and return annotations, in place."""
    args = fn.args
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    fn.returns = None


def canonical(source_or_fn: str | Callable[..., Any]) -> str | None:
    """A function's source reduced to what it does: the AST without annotations, docstring,
    decorators and comments (``None`` where the source cannot be read)."""
    fn = first_function(parse_source(source_or_fn)) if isinstance(source_or_fn, str) else function_node(source_or_fn)
    if fn is None:
        return None
    drop_annotations(fn)
    fn.decorator_list, fn.name, fn.body = [], "f", without_docstring(fn.body)
    return ast.dump(fn, include_attributes=False)
