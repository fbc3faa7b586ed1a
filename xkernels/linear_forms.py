"""``torch.nn.Linear`` subclasses whose forward computes ``F.linear``: ``xkernels.patch`` swaps them
as it swaps ``nn.Linear``.

A subclass may change what its layer computes, or be read by code that expects its own type, so
``patch`` leaves subclasses alone. Some families subclass ``nn.Linear`` only to write the same
product another way: Falcon's ``FalconLinear`` computes ``input @ self.weight.T`` and adds the
bias, which is ``F.linear`` up to rounding (PyTorch rounds the product before adding the bias;
``F.linear`` and xkernels add it in the GEMM's accumulator). A subclass is taken as a linear layer when:

* its class (and every class between it and ``nn.Linear``) defines nothing but ``forward``
  (besides a docstring), so that its parameters, ``extra_repr`` and state are ``nn.Linear``'s;
* its ``forward(self, x)``, read from source, is one of :data:`FORMS`, up to the names of its
  argument and locals, its annotations and docstring, and the names ``F``, ``nn`` and ``torch``
  are PyTorch's in the forward's module.

Everything else (another body, a class attribute, an ``__init__`` of its own, a source that
cannot be read) stays a subclass that ``patch`` reports as left.
"""

from __future__ import annotations

import ast
from functools import lru_cache

import torch

from xkernels.source_forms import function_node, without_docstring

#: forwards equal to ``F.linear(x, self.weight, self.bias)``, as written in model code
FORMS = (
    "def forward(self, x):\n    return F.linear(x, self.weight, self.bias)",
    "def forward(self, x):\n    return nn.functional.linear(x, self.weight, self.bias)",
    "def forward(self, x):\n    return torch.nn.functional.linear(x, self.weight, self.bias)",
    # Falcon's FalconLinear
    "def forward(self, x):\n    h = x @ self.weight.T\n    if self.bias is None:\n        return h\n"
    "    return h + self.bias",
)

_ALLOWED = {"forward", "__module__", "__qualname__", "__doc__", "__firstlineno__", "__static_attributes__"}


def _canonical(fn: ast.FunctionDef) -> str | None:
    """The function's AST with its name, annotations and docstring dropped and its argument and
    locals renamed in order of appearance; ``None`` unless it takes exactly ``(self, x)``."""
    a = fn.args
    if (a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg or a.defaults or len(a.args) != 2
            or a.args[0].arg != "self"):
        return None
    body = without_docstring(fn.body)
    names = {a.args[1].arg: "x"}

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            if node.id != "self" and (node.id in names or isinstance(node.ctx, ast.Store)):
                names.setdefault(node.id, f"v{len(names)}")
                node.id = names[node.id]
            return node

    module = ast.Module(body=[Rename().visit(s) for s in body], type_ignores=[])
    return ast.dump(module, annotate_fields=False)


@lru_cache(maxsize=1)
def _forms() -> frozenset[str]:
    return frozenset(c for src in FORMS for c in [_canonical(ast.parse(src).body[0])] if c)


@lru_cache(maxsize=256)
def computes_linear(cls: type) -> bool:
    """Whether ``cls``, a strict subclass of ``torch.nn.Linear``, is one the module doc describes."""
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Linear)) or cls is torch.nn.Linear:
        return False
    between = cls.__mro__[:cls.__mro__.index(torch.nn.Linear)]
    if any(set(vars(c)) - _ALLOWED for c in between):
        return False
    owner = next((c for c in between if "forward" in vars(c)), None)
    if owner is None:  # nn.Linear's own forward: a subclass only to mark its layers for other code
        return False
    forward = vars(owner)["forward"]
    fn = function_node(forward)
    if fn is None or fn.decorator_list or _canonical(fn) not in _forms():
        return False
    # the names the forms call through are PyTorch's in the forward's module (not another ``F``)
    scope = getattr(forward, "__globals__", {})
    return (scope.get("F", torch.nn.functional) is torch.nn.functional and scope.get("nn", torch.nn) is torch.nn
            and scope.get("torch", torch) is torch)
