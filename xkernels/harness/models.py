"""The real-model shape corpus: the GEMMs and element-wise calls of a few well-known models.

The layer sizes are data (``models.json``, with their sources): BERT-base, GPT-2 small,
Llama-3-8B, ViT-B/16 linear layers at every token count of ``"tokens"`` (1, 16, 128, 512,
2048, 8192 and 64 x 197), and element-wise calls (residual adds ``[B,S,H]``, linear biases,
attention and causal masks, ResNet-50's NCHW channel biases). Cases carry the size tag
``models`` and the names of the models they come from (``Case.models``); layers of the same
shape in several models are one case naming all of them.

``linear`` cases are ``F.linear(x[M, in], weight[out, in], bias, activation)`` as the model runs
them; ``matmul`` cases are the same products as ``x[M, in] @ w[in, out]`` (no bias, no
activation). ``add`` gets every element-wise entry, ``broadcast`` the ones whose second operand
broadcasts to the first.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

MODELS_JSON = Path(__file__).with_name("models.json")
SIZE_TAG = "models"


@functools.lru_cache(maxsize=1)
def corpus() -> dict[str, Any]:
    """The parsed ``models.json``."""
    return json.loads(MODELS_JSON.read_text())


def model_names() -> list[str]:
    """Every model the corpus names, in order of first appearance."""
    data = corpus()
    names = [g["model"] for g in data["gemms"]] + [e["model"] for e in data["elementwise"]]
    return list(dict.fromkeys(names))


def gemm_layers(op: str) -> list[tuple[tuple[Any, ...], list[str], list[str]]]:
    """(shape key, "model.layer" labels, models) per distinct layer shape of ``op``."""
    merged: dict[tuple[Any, ...], tuple[list[str], list[str]]] = {}
    for g in corpus()["gemms"]:
        key = (g["in"], g["out"], g["activation"], g["bias"]) if op == "linear" else (g["in"], g["out"])
        labels, models = merged.setdefault(key, ([], []))
        labels.append(f"{g['model']}.{g['layer']}")
        if g["model"] not in models:
            models.append(g["model"])
    return [(k, labels, models) for k, (labels, models) in merged.items()]
