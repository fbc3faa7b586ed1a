"""The README's first commands stay runnable: extras exist, modules and options parse, and a
CPU-only machine is shown how to get PyTorch's CPU build before the project install."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _first_bash_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no bash block"
    return [line for line in block[1].splitlines() if line.strip() and not line.startswith("#")]


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
