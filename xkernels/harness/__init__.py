"""Shared accuracy and performance harnesses behind ``python -m xkernels.check`` and ``xkernels.bench``.

* :mod:`~xkernels.harness.cases`: per-op case lists (layouts, dtypes, sizes);
* :mod:`~xkernels.harness.case`: one case (:class:`Case`, its operands, fresh random inputs);
* :mod:`~xkernels.harness.torch_ops`: PyTorch's version of each op (reference and baseline);
* :mod:`~xkernels.harness.tolerances`: allowed error per dtype/op/backend, each with its source;
* :mod:`~xkernels.harness.accuracy`: one case against a float64 reference;
* :mod:`~xkernels.harness.memory`: a case's estimated peak memory and the memory free to run it;
* :mod:`~xkernels.harness.perf`: timing with the backend's events, device ceilings, roofline.

This module resolves what a run targets: a backend and a torch device that work here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xkernels import dispatch
from xkernels.backend import Backend, UnknownBackendError
from xkernels.registry import registry


class TargetUnavailable(RuntimeError):
    """The requested device/backend cannot run here; the message is one line saying why."""


@dataclass(frozen=True)
class Target:
    """The backend that runs the ops and the torch device their tensors live on."""

    backend: Backend
    device: torch.device

    def __str__(self) -> str:
        return f"backend {self.backend.name!r} on {self.device}"


def resolve_target(device: str | None = None, backend: str | None = None) -> Target:
    """The target for ``--device`` (a torch device: cuda, npu, cpu, cuda:1) and/or ``--backend``
    (a registry name: interpreter, interpreter-npu, ...); neither means the best device present.

    Raises :class:`TargetUnavailable` with a one-line reason when it cannot run here.
    """
    if backend is not None:
        try:
            b = registry.backend(backend)
        except UnknownBackendError as exc:
            raise TargetUnavailable(str(exc)) from None
        dev_type = device.split(":")[0] if device else b.device_type
        if dev_type != b.device_type:
            raise TargetUnavailable(f"backend {b.name!r} runs on {b.device_type!r} tensors, not on device {device!r}")
    elif device is not None:
        dev_type = device.split(":")[0]
        try:
            b = dispatch.backend_for_device_type(dev_type)
        except ValueError as exc:
            raise TargetUnavailable(f"device {device!r}: {exc}") from None
    else:
        b = dispatch.best_available()
        dev_type = b.device_type
    reason = b.unavailable_reason()
    if reason is not None:
        raise TargetUnavailable(f"device {device or dev_type!r} (backend {b.name!r}) is not available: {reason}")
    try:
        dev = torch.device(device or dev_type)
        probe = torch.ones(4, device=dev) + 1  # present is not enough: it must compute
        b.synchronize(dev)
        if probe.sum().item() != 8:
            raise RuntimeError("1 + 1 is not 2 on this device")
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TargetUnavailable(f"device {device or dev_type!r} (backend {b.name!r}) is not working: "
                                f"{type(exc).__name__}: {first}") from None
    return Target(b, probe.device)  # "cuda" -> "cuda:0": the device tensors really land on


__all__ = ["Target", "TargetUnavailable", "resolve_target"]
