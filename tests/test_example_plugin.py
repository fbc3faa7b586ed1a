"""A real plugin package (tests/plugins/xkernels_example_plugin) installed through its entry
point: xkernels finds it without being told, dispatches an op to it, reads its tuning table."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN = Path(__file__).parent / "plugins" / "xkernels_example_plugin"


def test_example_plugin_installs_and_dispatches(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(PLUGIN)], check=True)
    script = textwrap.dedent("""
        import torch, xkernels, xkernels_example_plugin as plugin
        assert "example" in xkernels.list_backends(), xkernels.list_backends()
        x, y = torch.randn(5, 24), torch.randn(24)
        with xkernels.use_backend("example"):
            r = xkernels.ops.add(x, y, alpha=2)
            exp = xkernels.ops.add.explain(x, y)
        assert plugin.calls["add"] == 1, plugin.calls
        assert torch.allclose(r, x + 2 * y)
        assert exp.route == "plugin override", exp
        # ops it does not override still run on its device through the default route
        with xkernels.use_backend("example"):
            assert torch.allclose(xkernels.ops.broadcast(x, y), x + y)
        with xkernels.use_backend("interpreter"):
            exp = xkernels.ops.broadcast.explain(x, y)
        assert "xkernels_example_plugin" in exp.config_source and exp.config["BLOCK_N"] == 32, exp
        print("plugin ok")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "plugin ok" in res.stdout
