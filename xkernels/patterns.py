"""What ``xkernels.patch`` knows of model code, as data (``data/patch_patterns.json``): module
classes whose forward applies an activation to one projection, activation classes ``linear``
fuses, transformers' ``Conv1D``. Classes are looked up among already-imported modules only."""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

PATTERNS = Path(__file__).parent / "data" / "patch_patterns.json"


@lru_cache(maxsize=1)
def patterns() -> dict[str, Any]:
    return json.loads(PATTERNS.read_text())


def loaded(entries: list[dict[str, Any]]) -> list[tuple[type, dict[str, Any]]]:
    """The entries whose class is defined in an already-imported module."""
    found = []
    for e in entries:
        cls = getattr(sys.modules.get(e["module"]), e["class"], None)
        if isinstance(cls, type):
            found.append((cls, e))
    return found


def activation_of(module: torch.nn.Module) -> tuple[str, float] | str:
    """``(activation name, negative_slope)`` for a recognised activation module, else why not."""
    kind = type(module)
    if kind is torch.nn.ReLU:
        return ("relu", 0.01)
    if kind is torch.nn.SiLU:
        return ("silu", 0.01)
    if kind is torch.nn.LeakyReLU:
        return ("leaky_relu", float(module.negative_slope))
    if kind is torch.nn.GELU:
        return ("gelu" if module.approximate == "none" else "gelu_tanh", 0.01)
    for cls, e in loaded(patterns()["activations"]):
        if kind is cls:
            return (e["as"], 0.01)
    return f"{kind.__name__} is not an activation xkernels.ops.linear fuses"
