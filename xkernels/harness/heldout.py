"""The held-out shape set: GEMMs of model families that are not in the real-model corpus.

The layer sizes are data (``heldout.json``, with their sources): Falcon-7B, Mixtral-8x7B experts,
DeepSeek-MoE-16B experts, StarCoder2-7B, InternLM2-20B, Yi-34B, Baichuan2-13B, OLMo-1B and the
Qwen2.5-14B down projection, at token counts the corpus does not list (1, 7, 333, 1500, 4097,
8224, 16000). Nothing in the tables was tuned on them: they test the selection on shapes nobody
measured (``python -m xkernels.bench --size heldout``; ``tools/device_runs/heldout.sh``). Cases
carry the size tag ``heldout``:

* ``linear``: every layer as the model runs it (its bias and activation) at every token count,
  plus two layers with each activation (none, relu, gelu, gelu_tanh, silu, leaky_relu);
* ``matmul``: ``x @ w`` of six layers at every token count, and per-head attention products
  (``Q @ K^T`` and ``P @ V``) batched over the heads.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

HELDOUT_JSON = Path(__file__).with_name("heldout.json")
SIZE_TAG = "heldout"


@functools.lru_cache(maxsize=1)
def shapes() -> dict[str, Any]:
    """The parsed ``heldout.json``."""
    return json.loads(HELDOUT_JSON.read_text())


def _layer(model: str, layer: str) -> dict[str, Any]:
    return next(g for g in shapes()["linear"] if g["model"] == model and g["layer"] == layer)


def heldout_cases(op: str, dtype: torch.dtype, Case: Any, T: Any) -> list:  # noqa: N803 - the classes
    """The held-out cases of ``op`` in ``dtype`` (matmul/linear, floating dtypes), built with
    ``harness.cases``' ``Case`` and ``T`` (handed in: the cases module imports this one)."""
    if op not in ("matmul", "linear") or not dtype.is_floating_point:
        return []
    data, tags = shapes(), frozenset({SIZE_TAG})
    out: list[Any] = []
    seen: set[tuple[Any, ...]] = set()

    def linear_case(g: dict[str, Any], m: int, act: str | None) -> None:
        key = (m, g["in"], g["out"], act, g["bias"])
        if key in seen:
            return
        seen.add(key)
        args: tuple[Any, ...] = (T((m, g["in"]), dtype), T((g["out"], g["in"]), dtype),
                                 T((g["out"],), dtype) if g["bias"] else None)
        if act:
            args += (act,)
        label = f"{g['model']}.{g['layer']}" + (f" + {act}" if act else "") + ("" if g["bias"] else ", no bias")
        out.append(Case("linear", args, label, tags, models=(g["model"],)))

    if op == "linear":
        for g in data["linear"]:
            for m in data["tokens"]:
                linear_case(g, m, g["activation"])
        sweep = data["activations"]
        for model, layer in sweep["layers"]:
            for act in sweep["activations"]:
                for m in sweep["tokens"]:
                    linear_case(_layer(model, layer), m, act)
        return out
    for model, layer in data["matmul_2d"]["layers"]:
        g = _layer(model, layer)
        for m in data["tokens"]:
            out.append(Case("matmul", (T((m, g["in"]), dtype), T((g["in"], g["out"]), dtype)),
                            f"{model}.{layer} as x @ w", tags, models=(model,)))
    batched = data["matmul_batched"]
    for a in batched["attention"]:
        h, d = a["heads"], a["head_dim"]
        for s in batched["tokens"]:
            out.append(Case("matmul", (T((h, s, d), dtype), T((h, d, s), dtype)),
                            f"{a['model']} attention scores Q @ K^T", tags, models=(a["model"],)))
            out.append(Case("matmul", (T((h, s, s), dtype), T((h, s, d), dtype)),
                            f"{a['model']} attention P @ V", tags, models=(a["model"],)))
    return out
