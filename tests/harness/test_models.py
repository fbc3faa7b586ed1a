"""The real-model shape corpus: the layers the issue names, every token count, model filters."""

from __future__ import annotations

import pytest
import torch

from xkernels.cli import bench
from xkernels.harness.cases import cases
from xkernels.harness.models import corpus, model_names

TOKENS = (1, 16, 128, 512, 2048, 8192, 64 * 197)


def _gemms(op: str, dtype: torch.dtype, models=None) -> set[tuple]:
    """(M, K, N, activation, bias) of the corpus cases (linear: weight is (N, K))."""
    out = set()
    for c in cases([op], [dtype], ["models"], models):
        if op == "linear":
            (m, k), (n, _) = c.shapes[0], c.shapes[1]
            act = next((a for a in c.args[2:] if isinstance(a, str)), None)
            out.add((m, k, n, act, c.args[2] is not None))
        else:
            (m, k), (_, n) = c.shapes
            out.add((m, k, n, None, False))
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_linear_layers_of_the_named_models_at_every_token_count(dtype):
    have = _gemms("linear", dtype)
    layers = [(768, 2304, None, True), (768, 768, None, True), (768, 3072, "gelu", True), (768, 3072, "gelu_tanh", True),
              (3072, 768, None, True),
              (4096, 6144, None, False), (4096, 4096, None, False), (4096, 14336, "silu", False),
              (4096, 14336, None, False), (14336, 4096, None, False), (768, 50257, None, False)]
    for k, n, act, bias in layers:
        for m in TOKENS:
            assert (m, k, n, act, bias) in have, (m, k, n, act, bias)
    assert len(have) == len(cases(["linear"], [dtype], ["models"]))  # a shape shared by models is one case


def test_matmul_cases_are_the_same_products_and_filters_narrow():
    lin = {(m, k, n) for m, k, n, *_ in _gemms("linear", torch.bfloat16)}
    assert {(m, k, n) for m, k, n, *_ in _gemms("matmul", torch.bfloat16)} == lin
    llama = _gemms("matmul", torch.bfloat16, ["llama3-8b"])
    assert {(k, n) for _, k, n, *_ in llama} == {(4096, 6144), (4096, 4096), (4096, 14336), (14336, 4096)}
    bert = cases(["linear"], [torch.float16], ["models"], ["bert-base"])
    assert bert and all("bert-base" in c.models for c in bert)
    assert any("gpt2" in c.models and "vit-b16" in c.models for c in bert)  # shared shapes name every model
    with pytest.raises(ValueError, match="unknown model"):
        cases(["linear"], None, ["models"], ["no-such-model"])


def test_elementwise_corpus_and_tags():
    adds = cases(["add"], [torch.bfloat16], ["models"])
    labels = " | ".join(c.layout for c in adds)
    for needle in ("residual add [B,S,H]", "channel bias (C,1,1) over NCHW", "attention mask [B,1,1,S]",
                   "causal mask"):
        assert needle in labels
    assert {c.shapes[1] for c in cases(["broadcast"], [torch.float32], ["models"], ["resnet50"])} == {
        (64, 1, 1), (256, 1, 1), (512, 1, 1), (1024, 1, 1), (2048, 1, 1)}
    for c in cases(["broadcast"], [torch.float16], ["models"]):  # broadcast never grows x
        assert torch.broadcast_shapes(c.shapes[0], c.shapes[1]) == c.shapes[0]
    assert not cases(["add"], [torch.int32], ["models"])  # models run in floating point
    every = cases(sizes=["models"], dtypes=[torch.float32])
    assert all(c.sizes == {"models"} for c in every)
    assert not set(cases(sizes=["quick", "full", "small", "medium", "large"])) & set(every)
    assert set(model_names()) >= {"bert-base", "gpt2", "llama3-8b", "vit-b16", "resnet50"}
    assert corpus()["source"] and list(corpus()["tokens"]) == list(TOKENS)


def test_a_corpus_case_builds_its_layout():
    c = next(c for c in cases(["linear"], [torch.bfloat16], ["models"]) if c.shapes[0] == (1, 768)
             and c.shapes[1] == (3072, 768) and "gelu_tanh" not in c.args)
    inputs = c.make_inputs("cpu", 0)
    x, w, b, act = inputs.args
    assert (x.shape, w.shape, b.shape, act) == ((1, 768), (3072, 768), (3072,), "gelu")
    assert x.dtype == w.dtype == b.dtype == torch.bfloat16


def test_bench_selects_the_corpus(capsys):
    picked = bench.select_cases(["linear"], [torch.float16], ["models"], False, ["llama3-8b"])
    assert len(picked) == 5 * len(TOKENS)
    assert bench.main(["--backend", "cpu", "--op", "linear", "--model", "gpt2"]) == 2
    assert "needs --size models" in capsys.readouterr().err


def test_bench_runs_a_corpus_case(tmp_path):
    out = tmp_path / "run.json"
    assert bench.main(["--backend", "cpu", "--size", "models", "--model", "llama3-8b", "--op", "add",
                       "--dtype", "fp32", "--fast", "--json", str(out)]) == 0
    import json

    rows = json.load(open(out))["rows"]
    assert [(r["shape"], r["layout"]) for r in rows] == [("16x1x4096 + 16x1x4096",
                                                          "llama3-8b: residual add [B,S,H], decode")]
    assert rows[0]["time_ms"] > 0 and rows[0]["torch_time_ms"] > 0
