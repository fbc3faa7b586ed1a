"""python -m xkernels.bench: rows and header, unusable devices, --compare, --plot."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys

import pytest

import xkernels
from helpers import require_interpreter
from xkernels import peaks
from xkernels.backend import Backend
from xkernels.cli import bench

ROW_FIELDS = {"op", "dtype", "shape", "layout", "device", "backend", "config", "route", "time_ms", "p20_ms",
              "p80_ms", "torch_time_ms", "speedup", "band", "gbps", "tflops", "pct_of_peak", "bound"}
HEADER_FIELDS = {"device_name", "device", "backend", "date", "torch", "triton", "host", "copy_bandwidth",
                 "matmul_peak", "datasheet"}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory, peaks_dir):
    """One fast cpu run of add + matmul (float32), written as JSON and CSV."""
    out = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XKERNELS_CACHE_DIR", str(peaks_dir))
        rc = bench.main(["--device", "cpu", "--op", "add,matmul", "--dtype", "float32", "--fast",
                         "--json", str(out / "run.json"), "--csv", str(out / "run.csv")])
    return rc, out


def test_json_rows_and_header(cpu_run):
    rc, out = cpu_run
    assert rc == 0
    data = json.loads((out / "run.json").read_text())
    assert HEADER_FIELDS <= set(data["header"]), data["header"]
    assert data["header"]["copy_bandwidth"]["source"] == "measured"
    rows = data["rows"]
    assert [r["op"] for r in rows] == ["add", "matmul"]
    for r in rows:
        assert ROW_FIELDS <= set(r), set(r) ^ ROW_FIELDS
        assert r["device"] == "cpu" and r["backend"] == "cpu" and r["dtype"] == "float32"
        assert r["time_ms"] > 0 and r["torch_time_ms"] > 0 and r["p20_ms"] <= r["time_ms"] <= r["p80_ms"]
        assert r["speedup"] == pytest.approx(r["torch_time_ms"] / r["time_ms"])
        assert r["gbps"] > 0
        # cache-resident (add) / not bf16 (matmul float32): a % of the DRAM copy bandwidth or of the
        # bf16 matmul peak would mislead, so there is none, and the row says why
        assert r["pct_of_peak"] is None and "not bounded by" in r["pct_of_peak_omitted"]
    assert "last-level cache" in rows[0]["pct_of_peak_omitted"]
    assert "runs PyTorch" in data["header"]["measures"] and "front-door overhead" in data["header"]["measures"]
    assert "last-level cache" in data["header"]["pct_of_peak_shown_for"]
    assert rows[0]["tflops"] is None and rows[0]["bound"] == "memory"
    assert rows[1]["tflops"] > 0 and rows[1]["flops"] == 2 * 256**3
    with open(out / "run.csv") as f:
        assert [r["op"] for r in csv.DictReader(f)] == ["add", "matmul"]


def test_cpu_header_says_what_the_ratio_measures(capsys, peaks_dir, monkeypatch):
    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(peaks_dir))
    assert bench.main(["--device", "cpu", "--op", "add", "--dtype", "float32", "--fast"]) == 0
    out = capsys.readouterr().out
    assert ("  speedup        the cpu backend runs PyTorch: the ratio measures xkernels' front-door overhead "
            "(checks, dispatch) over calling PyTorch directly, not a kernel") in out
    assert "  % peak         memory-bound cases with a working set >= 4x the" in out
    (row,) = [line for line in out.splitlines() if line.startswith("add ")]
    assert " - " in row and "%" not in row, row


def test_ceilings_are_cached(cpu_run):
    name = xkernels.get_backend("cpu").properties().name
    for key in ("copy_bandwidth", "matmul_peak"):
        fig = peaks.cached_figure("cpu", name, key)
        assert fig is not None and fig.value > 0 and fig.source == "measured"


def test_compare_reports_faster_and_slower(cpu_run, tmp_path, capsys):
    _, out = cpu_run
    old = json.loads((out / "run.json").read_text())
    old["rows"][0]["time_ms"] *= 1000  # the new run will look much faster here
    old["rows"][1]["time_ms"] /= 1000  # ... and much slower here
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    rc = bench.main(["--device", "cpu", "--op", "add,matmul", "--dtype", "float32", "--fast", "--compare", str(path)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "2 matching rows: 1 faster, 1 slower, 0 same" in text, text
    lines = [line for line in text.splitlines() if "->" in line]
    assert "faster" in lines[0] and lines[0].lstrip().startswith("add")
    assert "slower" in lines[1] and lines[1].lstrip().startswith("matmul")


def test_compare_function_matches_rows_by_key():
    row = {"op": "add", "dtype": "float16", "shape": "8x8 + 8x8", "layout": "same shape"}
    old = [{**row, "time_ms": 1.0}, {**row, "shape": "gone", "time_ms": 1.0}]
    new = [{**row, "time_ms": 1.02}, {**row, "shape": "new", "time_ms": 3.0}]
    lines = bench.compare(old, new)
    assert "same" in lines[0]
    assert lines[-1].strip().startswith("1 matching rows: 0 faster, 0 slower, 1 same") and "1 new rows" in lines[-1]


def test_interpreter_backend_runs_the_kernel(capsys, tmp_path):
    import xkernels

    reason = xkernels.get_backend("interpreter").unavailable_reason()
    if reason:  # e.g. Triton 3.6 with numpy >= 2.4 on a GPU image; CI pins a working pair
        pytest.skip(reason)
    path = tmp_path / "interp.json"
    rc = bench.main(["--backend", "interpreter", "--op", "broadcast", "--dtype", "float32", "--fast",
                     "--json", str(path)])
    assert rc == 0
    data = json.loads(path.read_text())
    (row,) = data["rows"]
    assert "Triton's interpreter" in data["header"]["measures"]
    assert row["backend"] == "interpreter" and row["route"] == "triton kernel"
    assert {"BLOCK_M", "BLOCK_N"} <= set(row["config"])


def test_rotary_embedding_cases_are_benched(tmp_path, peaks_dir, monkeypatch):
    """rotary_embedding's bench cases: the model layers in the size classes (forward and
    forward+backward rows), --fast on the cpu its smallest (Llama-3-8B decode) with both results'
    bytes counted."""
    import torch

    picked = bench.select_cases(["rotary_embedding"], [torch.bfloat16], ["small", "medium", "large"], False)
    layouts = {c.layout for c in picked}
    assert "Llama-3-8B prefill 1x2048" in layouts and "Llama-3-8B prefill 1x2048, forward+backward" in layouts
    assert any(c.backward for c in picked) and any(not c.backward for c in picked)
    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(peaks_dir))
    path = tmp_path / "rotary.json"
    assert bench.main(["--device", "cpu", "--op", "rotary_embedding", "--dtype", "float32", "--fast",
                       "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert row["op"] == "rotary_embedding" and row["layout"] == "Llama-3-8B decode 64x1"
    q, k, table = 64 * 32 * 128 * 4, 64 * 8 * 128 * 4, 64 * 128 * 4
    assert row["bytes"] == 2 * (q + k) + 2 * table and row["time_ms"] > 0 and row["torch_time_ms"] > 0


@pytest.mark.parametrize("device", ["npu", "cuda"])
def test_absent_device_exits_2_with_one_line(device):
    if xkernels.get_backend(device).is_available():
        pytest.skip(f"a {device} device is present here")
    proc = subprocess.run([sys.executable, "-m", "xkernels.bench", "--device", device],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert device in lines[0] and "not available" in lines[0]


class BrokenBackend(Backend):
    name = "broken-test"
    device_type = "cpu"
    default_for_device = False

    def unavailable_reason(self) -> str | None:
        return "its driver is on holiday"


def test_unavailable_backend_reason_is_the_line(capsys):
    class Plugin:
        @xkernels.hookimpl
        def xkernels_add_backends(self):
            return [BrokenBackend()]

    plugin = Plugin()
    xkernels.registry.register(plugin)
    try:
        rc = bench.main(["--backend", "broken-test", "--fast"])
    finally:
        xkernels.registry.unregister(plugin)
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert captured.err.strip().splitlines() == [
        "xkernels.bench: device 'cpu' (backend 'broken-test') is not available: its driver is on holiday"]


def test_plot_writes_png_or_says_why(cpu_run, tmp_path, capsys):
    png = tmp_path / "roof.png"
    rc = bench.main(["--device", "cpu", "--op", "add", "--dtype", "float32", "--fast", "--plot", str(png)])
    captured = capsys.readouterr()
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2 and not png.exists()
        assert captured.err.strip().splitlines() == [
            "xkernels.bench: --plot needs matplotlib, which is not installed: pip install 'xkernels[bench]'"]
    else:
        assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_compare_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert bench.main(["--device", "cpu", "--fast", "--compare", str(bad)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_host_mode_on_cpu_times_every_form_with_the_launch_stubbed(capsys):
    """``--host`` on the CPU: the front door of every documented form, under the interpreter
    backend with launches stubbed (said in the header); every repeat is hot (0 full paths), and the
    stub is undone afterwards."""
    from xkernels.launch import Launcher

    require_interpreter()
    real = Launcher.__call__
    assert bench.main(["--host", "--device", "cpu", "--rounds", "1", "--calls", "3"]) == 0
    out = capsys.readouterr().out
    assert "Launcher.__call__ stubbed" in out and Launcher.__call__ is real
    # form -> its full paths per call (the column before the enabled() rows' "[routes]")
    rows = {line[:42].strip(): line[42:].split("[")[0].split()[-1] for line in out.splitlines()[3:]}
    routes = {line[:42].strip(): line.split("[", 1)[1] for line in out.splitlines()[3:] if "[" in line[42:]}
    assert set(routes) == {"enabled(): x + y", "enabled(): x @ w", "enabled(): F.linear(x, w, b)",
                           "training: enabled(): F.linear"}, out
    assert routes["enabled(): x + y"].startswith("add.Tensor: ") and "addmm: " in routes["enabled(): F.linear(x, w, b)"]
    for form in ("add(x, y)", "add(x, 2.0)", "add(x, y, alpha=2)", "broadcast(x, b)", "broadcast(x, b, out=o)",
                 "matmul(a, b)", "linear(x, w)", "linear(x, w, b)", 'linear(x, w, b, "gelu")',
                 'linear(x, w, bias=b, activation="gelu")', "nn.Linear module (no_grad)", "enabled(): x + y",
                 "enabled(): x @ w", "enabled(): F.linear(x, w, b)", "Llama MLP",
                 "Llama attention's rotary embedding", "MoE experts' gate"):
        assert rows[form] == "0.00", (form, out)
    # the patched blocks' rows: one full path per add + norm call until add_norm has routes
    for form, norms in (("BERT output block", 1), ("Llama decoder layer (add+norm steps)", 2)):
        assert float(rows[form]) <= norms, (form, out)
