"""Keep ``import torch`` (and so ``import xkernels``) working when torch_npu is half-installed.

torch >= 2.5 imports every installed device-backend extension at ``import torch``
(TORCH_DEVICE_BACKEND_AUTOLOAD). torch_npu links against CANN, so where torch_npu is installed but
CANN is not, that import raises and takes ``import torch`` down with it. When torch is not yet
imported, torch_npu is installed and no CANN environment is set, switch autoloading off (unless
the user chose a value); the npu backend imports torch_npu itself, catching the failure.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def guard() -> None:
    if "torch" in sys.modules or "TORCH_DEVICE_BACKEND_AUTOLOAD" in os.environ:
        return
    if os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME"):
        return
    try:
        has_torch_npu = importlib.util.find_spec("torch_npu") is not None
    except (ImportError, ValueError):
        has_torch_npu = False
    if has_torch_npu:
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
