"""Every file under tools/ is a working, documented entry point: python files compile and answer
``--help`` against the current API, shell scripts parse, and tools/README.md names each one."""

from __future__ import annotations

import json
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
PY = sorted(TOOLS.rglob("*.py"))
SH = sorted(TOOLS.rglob("*.sh"))

# Runs each tool as ``python tool.py --help`` in one interpreter (torch imported once): argparse
# exits 0 after printing its usage; a tool whose imports broke raises before that.
HELP = """
import contextlib, io, runpy, sys
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            assert e.code in (0, None), (path, e.code)
        else:
            raise AssertionError(path + ": --help did not exit")
    assert "usage:" in out.getvalue(), (path, out.getvalue()[:200])
    print("ok", path)
"""


def test_tools_has_files():
    assert PY and SH


@pytest.mark.parametrize("path", PY, ids=lambda p: str(p.relative_to(TOOLS)))
def test_python_tool_compiles(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "out.pyc"), doraise=True)


def test_python_tools_import_and_answer_help():
    with_argparse = [str(p) for p in PY if "argparse" in p.read_text()]
    assert len(with_argparse) == len(PY), "every tool takes --help (argparse)"
    r = subprocess.run([sys.executable, "-c", HELP, *with_argparse], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.count("ok ") == len(with_argparse), r.stdout


@pytest.mark.parametrize("path", SH, ids=lambda p: str(p.relative_to(TOOLS)))
def test_shell_script_parses(path):
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_readme_names_every_tool():
    readme = (TOOLS / "README.md").read_text()
    missing = [str(p.relative_to(TOOLS)) for p in PY + SH if p.name not in readme]
    assert not missing, f"tools/README.md does not document {missing}"


def test_bench_summary_reads_a_committed_bench_file():
    bench = ROOT / "results" / "2026-11-23-h100-seed-sizes" / "bench-small.json"
    r = subprocess.run([sys.executable, str(TOOLS / "bench_summary.py"), str(bench), "--worst", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = json.loads(bench.read_text())["rows"]
    for op in {row["op"] for row in rows}:
        assert f"\n{op} " in "\n" + r.stdout, (op, r.stdout)


def test_selection_diff_runs_on_cpu(tmp_path):
    """The CPU-only selection listing runs against the current selection code and --diff of a run
    against itself reports no moved route."""
    out = tmp_path / "sel.json"
    tool = TOOLS / "probes" / "selection_diff.py"
    r = subprocess.run([sys.executable, str(tool), "--json", str(out), "--dtype", "bfloat16"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(out.read_text()), "no selections written"
    r = subprocess.run([sys.executable, str(tool), "--json", str(tmp_path / "again.json"), "--dtype", "bfloat16",
                        "--diff", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1].startswith("0 of "), r.stdout[-2000:]


def test_family_sweep_builds_a_composite_models_part_and_trains_without_a_cache():
    """``family_sweep.build``: a config AutoModel has no base model for (OWL-ViT's vision part) is
    built as the class its modeling module declares for it; ``inputs_for`` asks a forward that
    takes ``use_cache`` for none (a training step; hybrid linear-attention caches refuse one)."""
    import runpy

    from helpers import require_transformers

    require_transformers()
    import transformers as tf

    sweep = runpy.run_path(str(TOOLS / "probes" / "family_sweep.py"), run_name="family_sweep")
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        tf.AutoModel.from_config(sweep["shrink"](tf.AutoConfig.for_model("owlvit_vision_model")))
    model = sweep["build"](sweep["shrink"](tf.AutoConfig.for_model("owlvit_vision_model")))
    assert type(model).__name__ == "OwlViTVisionModel"
    cfg = sweep["shrink"](tf.AutoConfig.for_model("llama"))
    inputs = sweep["inputs_for"](sweep["build"](cfg), cfg, "cpu")
    assert inputs["use_cache"] is False and inputs["input_ids"].shape == (2, 7)
