"""Autotune on first use (interpreter): tune once, cache, read in a fresh process, never re-tune a
measured bucket or a forced config, concurrent writers, export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import xkernels
from helpers import Unchanged, assert_close
from xkernels import autotune, tuning
from xkernels.cli import tune
from xkernels.ops import add, linear

pytestmark = pytest.mark.uses_interpreter

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache, autotune off in the environment, the ops' plans forgotten."""
    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("XKERNELS_AUTOTUNE", raising=False)
    monkeypatch.setattr(autotune, "_warned", False)
    monkeypatch.setattr(autotune, "_tuned", set())
    for op in (add, linear):
        op._forget()
    yield tmp_path / "tuning" / "interpreter"
    for op in (add, linear):
        op._forget()


def _rules(path: Path) -> list[dict]:
    return json.loads(path.read_text())["archs"]["interpreter"]


def test_off_by_default(cache):
    x, y = torch.randn(24, 136), torch.randn(136)
    with xkernels.use_backend("interpreter"):
        assert torch.equal(add(x, y), x + y)
    assert not (cache / "add.json").exists()


def test_first_use_tunes_once_caches_and_says_so_once(cache):
    x, y = torch.randn(24, 136), torch.randn(136)
    with xkernels.use_backend("interpreter"), tuning.autotune():
        with pytest.warns(RuntimeWarning, match=r"autotuning add float32 tiled 3264 elements on cpu; results cached in "
                                                + str(cache / "add.json").replace(".", r"\.")):
            with Unchanged(x, y):
                got = add(x, y)
        assert_close(got, x.double() + y.double())
        rules = _rules(cache / "add.json")
        assert [r["when"] for r in rules] == [{"variant": "tiled", "dtype": ["float32"], "numel_min": 0,
                                               "numel_max": 2**17}]
        assert rules[0]["measured"]["by"] == "autotune" and rules[0]["measured"]["ms"] > 0
        assert str(cache) in add.explain(x, y).config_source
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="xkernels: autotun")  # a second bucket: no second warning
            a, w, b = torch.randn(8, 32), torch.randn(16, 32), torch.randn(16)
            out = linear(a, w, b, "gelu")
        ref = torch.nn.functional.gelu(a.double() @ w.double().T + b.double())
        assert_close(out, ref)
    (rule,) = _rules(cache / "linear.json")
    assert rule["when"] == {"dtype": ["float32"], "n": 16, "k": 32, "batch": 1, "activation": "gelu", "bias": True,
                            "m_min": 8, "m_max": 15}
    table = json.loads((ROOT / "ops/tuning/interpreter/linear.json").read_text())
    assert rule["config"] in table["candidates"]["default"][0]["configs"]


def test_a_measured_rule_is_never_retuned_and_a_forced_config_never_tunes(cache, monkeypatch):
    x, y = torch.randn(40, 200), torch.randn(40, 200)
    with xkernels.use_backend("interpreter"), tuning.autotune(), pytest.warns(RuntimeWarning, match="autotuning"):
        add(x, y)
    assert len(_rules(cache / "add.json")) == 1
    add._forget()

    def boom(*a, **k):
        raise AssertionError("tuned again")

    monkeypatch.setattr(autotune, "tune", boom)
    with xkernels.use_backend("interpreter"), tuning.autotune():
        assert torch.equal(add(x, y), x + y)  # the cached rule is measured: planned without tuning
        with tuning.force({"BLOCK": 1024}):  # a sweep's forced config
            assert torch.equal(add(x + 1, y), x + 1 + y)
        add._forget()
        z = torch.randn(3, 5)
        with tuning.autotune(False):
            assert torch.equal(add(z, z), z + z)


def test_a_fresh_process_reads_the_cache(cache):
    x, y = torch.randn(24, 136), torch.randn(136)
    with xkernels.use_backend("interpreter"), tuning.autotune(), pytest.warns(RuntimeWarning):
        add(x, y)
    code = ("import torch, xkernels; from xkernels.ops import add\n"
            "with xkernels.use_backend('interpreter'):\n"
            "    print(add.explain(torch.randn(20, 100), torch.randn(100)).config_source)")
    env = {k: v for k, v in os.environ.items() if k != "XKERNELS_AUTOTUNE"}
    env["XKERNELS_CACHE_DIR"] = str(cache.parent.parent)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"add.json [interpreter] rule 0 ({cache})" in out.stdout


WRITER = """
import sys
from xkernels import autotune
who = int(sys.argv[1])
for i in range(20):
    autotune.write_rules("add", "interpreter", "interpreter",
                         [{"when": {"numel_min": who * 1000 + i}, "config": {"BLOCK": 1024}, "measured": {}}])
"""


def test_concurrent_writers_keep_every_rule(cache):
    env = {**os.environ, "XKERNELS_CACHE_DIR": str(cache.parent.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(who)], env=env) for who in (1, 2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    rules = _rules(cache / "add.json")
    assert sorted(r["when"]["numel_min"] for r in rules) == sorted(w * 1000 + i for w in (1, 2) for i in range(20))
    assert not list(cache.glob("*.tmp")) and not list(cache.glob(".*.tmp"))


def test_export_cache_writes_tables(cache, tmp_path, capsys):
    autotune.write_rules("add", "interpreter", "interpreter",
                         [{"when": {"variant": "flat"}, "config": {"BLOCK": 1024}, "measured": {"by": "autotune"}}])
    out = tmp_path / "tables"
    assert tune.main(["--export-cache", "--backend", "interpreter", "--out-dir", str(out)]) == 0
    table = json.loads((out / "add.json").read_text())
    assert table["archs"] == json.loads((cache / "add.json").read_text())["archs"]
    assert "exported from" in table["source"] and "wrote" in capsys.readouterr().out
    assert tune.main(["--export-cache", "--backend", "cpu", "--out-dir", str(out)]) == 0
    assert "is empty" in capsys.readouterr().out
