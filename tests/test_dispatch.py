"""Which backend runs a call (``xkernels/dispatch.py``): the tensors' device type, ``use_backend``
nested and restored, and the errors that name the device. (Threads and ``XKERNELS_BACKEND``:
tests/test_registry.py.)"""

from __future__ import annotations

import pytest
import torch

import xkernels
from xkernels import dispatch
from xkernels.dispatch import backend_for_device_type, override_name, select, use_backend


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch):
    """Selection by device type, whatever XKERNELS_BACKEND the test run was started with."""
    monkeypatch.setattr(dispatch, "_env_backend", None)


def test_device_type_picks_the_default_backend_of_that_type():
    assert select(torch.device("cpu")).name == "cpu"  # not "interpreter": it is not default_for_device
    assert select(torch.device("cuda", 1)).name == "cuda"
    assert backend_for_device_type("npu").name == "npu"
    assert xkernels.get_backend("cpu:0").name == "cpu"
    assert xkernels.get_backend(torch.device("cuda")).name == "cuda"
    # the cached per-device-type answer is the registry's own instance
    assert select(torch.device("cpu")) is xkernels.get_backend("cpu")


def test_a_device_type_nobody_serves_is_named():
    with pytest.raises(ValueError, match=r"no xkernels backend serves torch device type 'meta'; "
                                         r"served device types: .*cpu.*cuda.*npu"):
        select(torch.device("meta"))


def test_best_available_without_override_is_the_highest_priority_available():
    available = [xkernels.get_backend(n) for n in xkernels.list_backends()]
    expect = max((b for b in available if b.default_for_device and b.is_available()), key=lambda b: b.priority)
    assert xkernels.get_backend() is expect
    assert override_name() is None


def test_use_backend_nests_and_restores():
    cpu = torch.device("cpu")
    assert select(cpu).name == "cpu" and override_name() is None
    with use_backend("interpreter") as outer:
        assert outer.name == "interpreter" and select(cpu) is outer and xkernels.get_backend() is outer
        with use_backend("interpreter-npu") as inner:
            assert select(cpu) is inner and override_name() == "interpreter-npu"
        assert select(cpu) is outer and override_name() == "interpreter"
        with use_backend(xkernels.get_backend("cpu")):  # a Backend object works as well as a name
            assert select(cpu).name == "cpu"
        assert select(cpu) is outer
    assert select(cpu).name == "cpu" and override_name() is None


def test_use_backend_is_restored_after_an_exception():
    with pytest.raises(RuntimeError, match="inside"):
        with use_backend("interpreter"):
            with use_backend("interpreter-npu"):
                raise RuntimeError("inside")
    assert override_name() is None and select(torch.device("cpu")).name == "cpu"


def test_an_override_for_another_device_type_names_both_devices():
    with use_backend("cuda"):  # chosen by name even where no GPU is present; the call is refused
        with pytest.raises(ValueError, match=r"xkernels backend 'cuda' runs on 'cuda' tensors, "
                                             r"but the tensors are on cpu"):
            select(torch.device("cpu"))
        with pytest.raises(ValueError, match="'cuda' runs on 'cuda' tensors, but the tensors are on cpu"):
            xkernels.ops.add(torch.randn(3), torch.randn(3))  # the op front door asks the same question
    assert select(torch.device("cpu")).name == "cpu"


def test_unknown_names_are_refused_before_the_block_runs():
    ran = []
    with pytest.raises(xkernels.UnknownBackendError, match="unknown xkernels backend 'tpu'; known backends: "):
        with use_backend("tpu"):
            ran.append(1)
    assert not ran and override_name() is None
    with pytest.raises(xkernels.UnknownBackendError, match="'not a device'"):
        xkernels.get_backend("not a device")


def test_a_registered_backend_for_a_new_device_type_is_found_and_forgotten():
    """The per-device-type cache is cleared when plugins register and unregister."""

    class Xla(xkernels.Backend):
        name = "test-xla"
        device_type = "xla"

    class Plugin:
        @xkernels.hookimpl
        def xkernels_add_backends(self):
            return [Xla()]

    with pytest.raises(ValueError, match="device type 'xla'"):
        backend_for_device_type("xla")
    plugin = Plugin()
    xkernels.registry.register(plugin)
    try:
        assert backend_for_device_type("xla").name == "test-xla"
        assert "test-xla" in xkernels.list_backends()
    finally:
        xkernels.registry.unregister(plugin)
    with pytest.raises(ValueError, match="device type 'xla'"):
        backend_for_device_type("xla")
    assert "test-xla" not in xkernels.list_backends()
