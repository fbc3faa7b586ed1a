"""The layers import one way: contract and tables -> ops -> what runs the ops (harness, autotune,
sweeps, model integration, commands). Read from the source files (nothing is imported), counting
imports inside functions; only ``if TYPE_CHECKING:`` blocks are left out, since they never run.

A lower layer that must reach a higher one gets a hook (``xkernels_tune_plan``) or is handed a
callable (``library.register(ops)``, the autograd Functions' ``mm``/``lin``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"xkernels": ROOT / "xkernels", "xkernels.ops": ROOT / "ops", "xkernels.backends": ROOT / "backends"}

#: layer of each module, by longest matching prefix; a module may import its own layer or lower ones
LAYERS = {
    "xkernels._torch_guard": 0, "xkernels.backend": 0, "xkernels.cache": 0, "xkernels.hookspecs": 0,
    "xkernels.registry": 0, "xkernels.tuning": 0, "xkernels.dispatch": 0, "xkernels.peaks": 0,
    "xkernels.launch": 0, "xkernels.interleave": 0, "xkernels.compile_cases": 0,
    "xkernels.backends": 0,
    "xkernels.ops": 1,
    "xkernels.harness": 2, "xkernels.autotune": 2, "xkernels.sweep": 2, "xkernels.sweep_timing": 2,
    "xkernels.routing": 2, "xkernels.nn": 2,
    "xkernels.patching": 2, "xkernels.patterns": 2, "xkernels.blocks": 2, "xkernels.block_steps": 2,
    "xkernels.gated_forms": 2, "xkernels.add_norm_forms": 2, "xkernels.linear_forms": 2, "xkernels.activation_forms": 2,
    "xkernels.rotary_fusion": 2, "xkernels.attention_masks": 2, "xkernels.mask_decisions": 2,
    "xkernels.patch_saving": 2, "xkernels.source_forms": 2, "xkernels.experts_gates": 2,
    "xkernels.experts_forward": 2,
    "xkernels.cli": 3, "xkernels.bench": 3, "xkernels.check": 3, "xkernels.tune": 3, "xkernels.npu_compile": 3,
    "xkernels": 3,  # the package itself: the public facade
}
LAYER_NAMES = ("contract and tables", "ops", "what runs the ops", "commands")


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg, directory in sorted(PACKAGES.items(), key=lambda kv: -len(kv[0])):
        for path in directory.rglob("*.py"):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods.setdefault(".".join([pkg, *parts]), path)
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its source, outside TYPE_CHECKING blocks."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in mods:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(r for a in node.names if (r := resolve(a.name)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in mods else resolve(base)
                if target:
                    found.add(target)
    found.discard(name)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _prefix(module: str) -> str:
    return max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)


def _layer(module: str) -> int:
    return LAYERS[_prefix(module)]


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    """A new module is placed in a layer on purpose (listed in ``LAYERS``), not by default."""
    unplaced = [m for m in graph if m != "xkernels" and _prefix(m) == "xkernels"]
    assert not unplaced, f"modules with no layer in tests/test_layers.py's LAYERS: {unplaced}"


def test_no_import_cycle(graph: dict[str, set[str]]) -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    described = [" <-> ".join(c) + ": " + "; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a] & set(c)))
                 for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_layers_import_downwards(graph: dict[str, set[str]]) -> None:
    upward = [f"{a} ({LAYER_NAMES[_layer(a)]}) imports {b} ({LAYER_NAMES[_layer(b)]})"
              for a, targets in sorted(graph.items()) for b in sorted(targets) if _layer(b) > _layer(a)]
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def test_the_graph_sees_imports_inside_functions(graph: dict[str, set[str]]) -> None:
    """The check reads function-level imports: ``Op.plan`` reaches autotune only through the
    ``xkernels_tune_plan`` hook, and the registry loads ``xkernels.autotune`` by name as a plugin."""
    assert "xkernels.ops.elementwise.kernels" in graph["xkernels.ops.elementwise.binary"]  # a function-level import
    assert "xkernels.autotune" not in graph["xkernels.ops.op"]
