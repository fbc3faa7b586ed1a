"""xkernels: write a Triton operator once, run it on NVIDIA GPUs, Ascend NPUs and CPUs.

    import xkernels
    xkernels.list_backends()                # ['cpu', 'cuda', 'interpreter', 'interpreter-npu', 'npu']
    xkernels.ops.broadcast(x, bias)         # runs on the backend of x's device
    with xkernels.use_backend("interpreter"):
        xkernels.ops.add(x, y)              # the Triton kernel, interpreted on CPU tensors
"""

from pathlib import Path as _Path

from xkernels._torch_guard import guard as _guard


def _source_checkout_layout() -> None:
    """Imported from a source checkout (e.g. ``python -m ...`` run in the repository root, which
    puts the checkout ahead of site-packages): ``ops/`` and ``backends/`` sit beside this package
    rather than inside it, so look for subpackages there too, as the installed layout maps them."""
    here = _Path(__file__).resolve().parent
    root = here.parent
    if (not (here / "ops").is_dir() and (root / "pyproject.toml").is_file()
            and (root / "ops" / "__init__.py").is_file() and (root / "backends" / "__init__.py").is_file()):
        __path__.append(str(root))  # noqa: F821 - the package's own __path__


_source_checkout_layout()
_guard()

from xkernels.backend import (  # noqa: E402
    Backend,
    BackendUnavailableError,
    DeviceProperties,
    Figure,
    HostEvent,
    UnknownBackendError,
)
from xkernels.dispatch import get_backend, list_backends, use_backend  # noqa: E402
from xkernels.hookspecs import hookimpl  # noqa: E402
from xkernels.registry import OpImpl, TuningDir, registry  # noqa: E402
from xkernels.routing import disable, enable, enabled, enabled_ops, routing_counts  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendUnavailableError",
    "DeviceProperties",
    "Figure",
    "HostEvent",
    "OpImpl",
    "TuningDir",
    "UnknownBackendError",
    "disable",
    "enable",
    "enabled",
    "enabled_ops",
    "get_backend",
    "hookimpl",
    "list_backends",
    "nn",
    "ops",
    "patch",
    "registry",
    "routing_counts",
    "use_backend",
]


def __getattr__(name: str):
    import importlib

    if name in ("ops", "nn"):  # imported on first use: keeps `import xkernels` light
        return importlib.import_module(f"xkernels.{name}")
    if name in ("patch", "PatchReport"):
        return getattr(importlib.import_module("xkernels.patching"), name)
    raise AttributeError(f"module 'xkernels' has no attribute {name!r}")
