"""``python -m xkernels.bench --model``: tiny transformers models, torch eager vs enable() vs patch()."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import require_transformers
from xkernels import bench, bench_models

pytestmark = pytest.mark.uses_interpreter


def test_tiny_gpt2_all_variants(tmp_path, capsys):
    require_transformers()
    path = tmp_path / "model.json"
    rc = bench.main(["--model", "gpt2", "--config", "tiny", "--backend", "interpreter", "--batch", "1", "--seq", "8",
                     "--json", str(path)])
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    rows = data["rows"]
    assert rc == 0, out
    assert data["header"]["backend"] == "interpreter" and data["header"]["transformers"]
    assert [(r["variant"], r["mode"]) for r in rows] == [
        (v, m) for v in bench_models.VARIANTS for m in ("forward", "forward+backward")]
    for r in rows:
        assert r["time_ms"] > 0 and r["tokens_per_s"] == 8 / (r["time_ms"] * 1e-3)
        assert r["speedup"] == r["torch_time_ms"] / r["time_ms"]
        # fp32, 2 layers of hidden 64: every variant computes torch's function up to rounding
        assert r["max_abs_dev"] < 1e-4 and r.get("grad_rel_dev", 0.0) < 1e-4, r
    torch_rows = [r for r in rows if r["variant"] == "torch"]
    assert all(r["max_abs_dev"] == 0 and r["speedup"] == 1 for r in torch_rows)
    enable_rows = [r for r in rows if r["variant"] == "enable"]
    assert all(r["routed"]["addmm"]["xkernels"] > 0 for r in enable_rows), "enable() routed nothing"
    assert all(r["patch"] == {"replaced": 8, "fused": r["patch"]["fused"], "left": 2 - r["patch"]["fused"]}
               for r in rows if r["variant"].startswith("patch"))
    assert "gpt2       patch         forward" in out


def test_bad_model_arguments_exit_2(capsys):
    require_transformers()
    assert bench.main(["--model", "bert-base", "--config", "tiny", "--backend", "interpreter", "--seq", "65"]) == 2
    assert "--seq 65 exceeds the model's 64 positions" in capsys.readouterr().err
    assert bench.main(["--model", "gpt2", "--config", "tiny", "--backend", "interpreter", "--dtype", "fp16,fp32"]) == 2
    assert "--model takes one --dtype" in capsys.readouterr().err


def test_grad_deviation_reports_missing_gradients():
    want = {"a": torch.tensor([1.0, -4.0]), "b": torch.tensor([1e-19])}
    assert bench_models._grad_deviation({"a": torch.tensor([1.5, -4.0]), "b": torch.tensor([-1e-19])}, want) == 0.125
    try:
        bench_models._grad_deviation({"a": None, "b": torch.tensor([0.0])}, want)
    except RuntimeError as e:
        assert "no gradient reached 1 parameters (e.g. a)" in str(e)
    else:
        raise AssertionError("a missing gradient must be an error")
