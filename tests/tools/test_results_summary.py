"""results/README.md is what ``python tools/results_summary.py`` writes from the committed files,
and it lists every kept run; every run folder says what it is and records its device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
RUNS = sorted(p for p in RESULTS.iterdir() if p.is_dir())


def _summary(*args: str) -> str:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "results_summary.py"), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_results_readme_is_the_generated_table():
    assert _summary() == (RESULTS / "README.md").read_text(), \
        "results/README.md is stale: run python tools/results_summary.py > results/README.md"


def test_table_lists_every_run_folder():
    out = _summary()
    assert RUNS
    for run in RUNS:
        assert f"[{run.name}]({run.name}/)" in out, run.name


def test_run_folders_are_named_by_date_machine_purpose_and_record_their_device():
    for run in RUNS:
        date, (machine, _, purpose) = run.name[:10], run.name[11:].partition("-")
        assert run.name[10] == "-" and date[:2] == "20" and date[4] == date[7] == "-", run.name
        assert machine in ("h100", "h200", "cpu") and purpose, run.name
        readme = (run / "README.md").read_text()
        assert readme.startswith("# ") and "Reproduce:" in readme, run.name
        versions = (run / "device.txt").read_text() if (run / "device.txt").exists() else ""
        if not versions:  # an early sweep: its table records the device and versions
            versions = " ".join(json.loads(f.read_text()).get("source", "") for f in run.glob("*.json")
                                if isinstance(json.loads(f.read_text()), dict))
        gpu = {"h100": "H100", "h200": "H200"}.get(machine)
        assert (gpu is None or gpu in versions) and "torch 2." in versions and "triton" in versions.lower(), run.name


def test_summary_reads_a_bench_file_it_is_given(tmp_path):
    """A new run folder with a bench JSON shows up with its figures computed from the rows."""
    run = tmp_path / "2026-12-01-h100-example"
    run.mkdir()
    (run / "README.md").write_text("# an example run\n")
    rows = [{"op": "add", "dtype": "float16", "speedup": s} for s in (2.0, 0.5, 1.0)]
    (run / "bench.json").write_text(json.dumps({"header": {}, "rows": rows}))
    out = _summary("--results", str(tmp_path))
    assert "| [2026-12-01-h100-example](2026-12-01-h100-example/) | an example run |" in out
    assert "| 2026-12-01-h100-example | bench.json | add | float16 | 3 | 1.000x | 0.500x | 1 |" in out
