"""``python -m xkernels.bench --model``: tiny transformers models, torch eager vs enable() vs patch()."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import require_transformers
from xkernels.cli import bench, bench_models

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
        assert r["time_ms"] > 0 and r["device_ms"] > 0 and r["tokens_per_s"] == 8 / (r["time_ms"] * 1e-3)
        assert r["rounds"] == 1 and r["round_ms"] == [r["time_ms"]]  # tiny: one round
        assert r["speedup"] == r["torch_time_ms"] / r["time_ms"]
        assert r["device_speedup"] == r["torch_device_ms"] / r["device_ms"]
        # fp32, 2 layers of hidden 64: every variant computes torch's function up to rounding
        assert r["max_abs_dev"] < 1e-4 and r.get("grad_rel_dev", 0.0) < 1e-4, r
    torch_rows = [r for r in rows if r["variant"] == "torch"]
    assert all(r["max_abs_dev"] == 0 and r["speedup"] == 1 for r in torch_rows)
    enable_rows = [r for r in rows if r["variant"] == "enable"]
    assert all(r["routed"]["addmm"]["xkernels"] > 0 for r in enable_rows), "enable() routed nothing"
    assert all(r["patch"] == {"replaced": 8, "fused": r["patch"]["fused"], "left": 2 - r["patch"]["fused"]}
               for r in rows if r["variant"].startswith("patch"))
    assert "gpt2       patch         forward" in out


def test_rounds_interleave_the_variants_on_one_model(monkeypatch):
    """Each round times every variant with the model in that variant's state (patch applied
    and undone around it), the order reversed every other round."""
    require_transformers()
    import xkernels
    from xkernels.harness import resolve_target

    seen = []

    def fake_time(model, ids, target, settings):
        patched = any(isinstance(m, xkernels.nn.Linear | xkernels.nn.Conv1D) for m in model.modules())
        seen.append(("patch" if patched else "torch") + ("+enable" if xkernels.routing._selected else ""))
        return {m: (float(len(seen)), 1.0) for m in bench_models.MODES}

    monkeypatch.setattr(bench_models, "_time", fake_time)
    rows = bench_models.run("gpt2", "tiny", 1, 4, torch.float32, resolve_target(backend="cpu"), rounds=3,
                            variants=("torch", "patch", "enable"), log=lambda s: None)
    assert seen == ["torch", "patch", "torch+enable", "torch+enable", "patch", "torch", "torch", "patch",
                    "torch+enable"]
    patch_fwd = next(r for r in rows if r["variant"] == "patch" and r["mode"] == "forward")
    assert patch_fwd["round_ms"] == [2.0, 5.0, 8.0] and patch_fwd["time_ms"] == 5.0
    assert patch_fwd["speedup"] == sorted([1 / 2, 6 / 5, 7 / 8])[1] and patch_fwd["device_speedup"] == 1.0


def test_bad_model_arguments_exit_2(capsys):
    require_transformers()
    assert bench.main(["--model", "bert-base", "--config", "tiny", "--backend", "interpreter", "--seq", "65"]) == 2
    assert "--seq 65 exceeds the model's 64 positions" in capsys.readouterr().err
    assert bench.main(["--model", "gpt2", "--config", "tiny", "--backend", "interpreter", "--dtype", "fp16,fp32"]) == 2
    assert "--model takes one --dtype" in capsys.readouterr().err
    assert bench.main(["--model", "gpt2", "--config", "tiny", "--backend", "interpreter", "--rounds", "0"]) == 2
    assert "--rounds must be positive, got 0" in capsys.readouterr().err


def test_grad_deviation_reports_missing_gradients():
    want = {"a": torch.tensor([1.0, -4.0]), "b": torch.tensor([1e-19])}
    assert bench_models._grad_deviation({"a": torch.tensor([1.5, -4.0]), "b": torch.tensor([-1e-19])}, want) == 0.125
    try:
        bench_models._grad_deviation({"a": None, "b": torch.tensor([0.0])}, want)
    except RuntimeError as e:
        assert "no gradient reached 1 parameters (e.g. a)" in str(e)
    else:
        raise AssertionError("a missing gradient must be an error")
