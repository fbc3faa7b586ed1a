"""The commands (``xkernels/cli/``): each starts the way the README says and answers ``--help``."""

from __future__ import annotations

import subprocess
import sys

import pytest

COMMANDS = ["xkernels.bench", "xkernels.check", "xkernels.tune", "xkernels.npu_compile",
            "xkernels.cli.matmul_tables"]


@pytest.mark.parametrize("module", COMMANDS)
def test_help(module):
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: python -m {module}"), proc.stdout[:200]


@pytest.mark.parametrize("name", ["bench", "check", "tune", "npu_compile"])
def test_the_short_module_starts_the_cli_main(name):
    import importlib

    short, cli = importlib.import_module(f"xkernels.{name}"), importlib.import_module(f"xkernels.cli.{name}")
    assert short.main is cli.main
