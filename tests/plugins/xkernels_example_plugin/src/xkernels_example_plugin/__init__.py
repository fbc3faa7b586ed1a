"""A complete minimal xkernels backend plugin.

It adds a backend named "example" that serves CPU tensors, overrides ``add`` for it with its own
implementation, and ships a tuning table for the built-in "interpreter" backend.
"""

from pathlib import Path

import torch

import xkernels
from xkernels import Backend, DeviceProperties, OpImpl, TuningDir

calls = {"add": 0}


class ExampleBackend(Backend):
    name = "example"
    device_type = "cpu"
    default_for_device = False  # cpu tensors use it only when asked: use_backend("example")
    alignment = 64

    def unavailable_reason(self):
        return None

    def properties(self, device=None):
        return DeviceProperties(backend=self.name, name="example device", arch="example",
                                compute_units=1, compute_unit_kind="core", memory_bytes=None,
                                max_programs_per_launch=1)


def example_add(x, y, *, alpha=1, out=None):
    calls["add"] += 1
    result = torch.add(x, y, alpha=alpha)
    return out.copy_(result) if out is not None else result


@xkernels.hookimpl
def xkernels_add_backends():
    return [ExampleBackend()]


@xkernels.hookimpl
def xkernels_add_op_impls():
    return [OpImpl(op="add", backend="example", fn=example_add, note="(example plugin)")]


@xkernels.hookimpl
def xkernels_add_tuning_dirs():
    return [TuningDir(backend="interpreter", path=Path(__file__).parent / "tuning")]
