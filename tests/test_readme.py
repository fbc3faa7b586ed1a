"""The README works as pasted: its python blocks run in order (on CPU: the cpu backend and the
Triton interpreter), the commands its bash blocks name exist and answer ``--help``, its set-up
commands install extras that exist, and CI runs its test command."""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import require_interpreter

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# pages other branches are adding; the README links them already
PENDING_DOCS = {"docs/fused-ops.md", "docs/models.md", "docs/selection.md"}


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def _bash_lines() -> list[str]:
    return [line.split("#")[0].strip() for block in _blocks("bash") for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _first_bash_block() -> list[str]:
    block = _blocks("bash")[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("readme_backend", ["cpu", "interpreter"])
def test_python_blocks_run_as_pasted(readme_backend, tmp_path):
    """Every ```python block, concatenated in order, in a fresh interpreter with no GPU visible;
    ``XKERNELS_BACKEND=interpreter`` runs the same tour on the Triton kernels."""
    require_interpreter()  # the tour runs a block under use_backend("interpreter")
    code = "\n".join(_blocks("python"))
    assert "device = " in code and "xkernels.patch(" in code and "torch.compile(" in code
    env = {k: v for k, v in os.environ.items() if k != "XKERNELS_BACKEND"}
    env.update(CUDA_VISIBLE_DEVICES="", XKERNELS_CACHE_DIR=str(tmp_path / "cache"))
    if readme_backend != "cpu":
        env["XKERNELS_BACKEND"] = readme_backend
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert f"linear on backend '{readme_backend}'" in r.stdout, r.stdout[-3000:]
    assert "xkernels.patch: 0 blocks fused, 2 layers replaced (1 with a fused activation)" in r.stdout, r.stdout[-3000:]


def test_commands_of_the_bash_blocks_exist():
    """``python -m xkernels.X`` answers --help, ``python tools/...`` is a file, ``tox -e E`` an env."""
    lines = _bash_lines()
    modules = sorted({m for line in lines for m in re.findall(r"python -m (xkernels[\w.]*)", line)})
    assert {"xkernels.bench", "xkernels.check", "xkernels.tune"} <= set(modules), modules
    for module in modules:
        r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "usage" in r.stdout.lower(), (module, r.stderr[-2000:])
    for path in {p for line in lines for p in re.findall(r"python (tools/\S+\.py)", line)}:
        assert (ROOT / path).is_file(), path
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    envs = {line.split()[2] for line in lines if line.startswith("tox -e")}
    envs |= {e for line in lines for e in re.findall(r"tox -e ([\w-]+)", line)}
    assert {"cpu", "cuda", "npu"} <= envs, envs
    for env in envs:
        assert tox.has_section(f"testenv:{env}"), env


def test_first_commands_install_and_run_the_bench():
    lines = _first_bash_block()
    extras = importlib.metadata.metadata("xkernels").get_all("Provides-Extra")
    for line in lines:
        for step in line.split("&&"):
            words = shlex.split(step)
            if words[:3] == ["pip", "install", "-e"]:
                for extra in re.fullmatch(r"\.\[(.*)\]", words[3])[1].split(","):
                    assert extra in extras, (extra, line)
            if words[:2] == ["python", "-m"]:
                assert words[2] in ("xkernels.bench", "xkernels.check"), line
    assert lines[0].endswith("pip install -e '.[triton,bench]' && python -m xkernels.bench")
    assert lines[-1] == "pip install tox && tox -e cpu"


def test_cpu_only_install_gets_the_cpu_torch_build_first():
    lines = _first_bash_block()
    cpu = [line for line in lines if CPU_INDEX in line]
    assert len(cpu) == 1, lines
    steps = [s.strip() for s in cpu[0].split("&&")]
    torch_step = steps.index(f"pip install torch --index-url {CPU_INDEX}")
    project_step = next(i for i, s in enumerate(steps) if s.startswith("pip install -e"))
    assert torch_step < project_step and steps[-1] == "python -m xkernels.bench"
    assert lines.index(cpu[0]) == 1  # right next to the first command


def test_ci_runs_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "tox -e cpu" in commands
    assert "tox -e cpu" in _first_bash_block()[-1]


def test_links_resolve():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    assert links
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert set(missing) <= PENDING_DOCS, missing
