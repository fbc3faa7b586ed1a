"""``xkernels.source_forms``: a function's source as an AST, ``None`` where it cannot be read."""

from __future__ import annotations

import ast
import functools
import math

from xkernels.source_forms import (
    drop_annotations,
    first_function,
    function_node,
    located_tree,
    parse_source,
    source_tree,
    without_docstring,
)


def tag(fn):
    return fn


def wrap(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper


class Block:
    def forward(self, x: int) -> int:
        """Doubles."""
        return x + x

    @tag
    def tagged(self, x):
        return x

    @wrap
    def wrapped(self, x):
        return x


def test_a_method_gives_its_def():
    node = function_node(Block.forward)
    assert isinstance(node, ast.FunctionDef) and node.name == "forward"
    assert [a.arg for a in node.args.args] == ["self", "x"]
    assert function_node(Block().forward).name == "forward"  # a bound method: its function's
    body = without_docstring(node.body)
    assert len(node.body) == 2 and len(body) == 1 and isinstance(body[0], ast.Return)
    assert without_docstring(body) is body
    drop_annotations(node)
    assert node.returns is None and all(a.annotation is None for a in node.args.args)


def test_decorated_methods_keep_their_decorators():
    node = function_node(Block.tagged)
    assert node.name == "tagged" and [d.id for d in node.decorator_list] == ["tag"]
    node = function_node(Block.wrapped)  # inspect reads the function functools.wraps wraps
    assert node.name == "wrapped" and [d.id for d in node.decorator_list] == ["wrap"]


def test_a_nested_function_is_dedented():
    def outer():
        def inner(a, b=1):
            return a * b
        return inner

    node = function_node(outer())
    assert node.name == "inner" and [a.arg for a in node.args.args] == ["a", "b"]
    located = located_tree(outer())
    assert located.first == outer().__code__.co_firstlineno and located.filename == __file__
    assert first_function(located.tree).name == "inner"


def test_no_source_gives_none():
    square = lambda x: x * x
    assert function_node(square) is None and isinstance(source_tree(square), ast.Module)  # not a def
    for fn in (len, math.sqrt, object.__init__, None, 3, "def f(): pass"):
        assert function_node(fn) is None and source_tree(fn) is None and located_tree(fn) is None
    scope: dict = {}
    exec("class Made:\n    def forward(self, x):\n        return x\n", scope)  # noqa: S102
    assert function_node(scope["Made"].forward) is None and source_tree(scope["Made"]) is None


def test_a_source_string():
    assert first_function(parse_source("    def f(x):\n        return x\n")).name == "f"
    assert parse_source("def f(:\n") is None and parse_source("  x = 1\n    y = 2\n") is None
    assert first_function(parse_source("")) is None and first_function(parse_source("x = 1")) is None
    assert first_function(parse_source("async def f():\n    pass\n")) is None
