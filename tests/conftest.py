"""Test configuration: which backends the op suites run on.

``--backends`` (or env ``XKERNELS_TEST_BACKENDS``), comma-separated, default
``interpreter,interpreter-npu,cpu``. A requested backend that is not available here is an error
for the whole run (``tox -e cuda`` on a machine without a GPU fails loudly, never skips).
"""

from __future__ import annotations

import os

import pytest
import torch

import xkernels

DEFAULT = "interpreter,interpreter-npu,cpu"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--backends", default=os.environ.get("XKERNELS_TEST_BACKENDS", DEFAULT),
                     help="comma-separated xkernels backends the op suites run on")


def _requested(config: pytest.Config) -> list[str]:
    return [b.strip() for b in config.getoption("--backends").split(",") if b.strip()]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "uses_interpreter: runs on the interpreter backend whatever --backends says")
    from xkernels.backends import native

    native.module(wait=True)  # built (or loaded) before any test: every run takes the same paths
    for name in _requested(config):
        backend = xkernels.get_backend(name)
        reason = backend.unavailable_reason()
        if reason is not None:
            raise pytest.UsageError(f"requested test backend {name!r} is not available: {reason}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``uses_interpreter`` exercise machinery (tuning, autotune, the model bench) on
    the interpreter backend whatever backends the op suites run on. Where the interpreter cannot
    run (a GPU image's numpy, say) and the run did not ask for it, they are skipped with the
    reason (``-rs`` lists them; ``tox -e cpu`` runs them); where it was asked for, the run has
    already failed in :func:`pytest_configure`."""
    if item.get_closest_marker("uses_interpreter") is None:
        return
    reason = xkernels.get_backend("interpreter").unavailable_reason()
    if reason is not None and "interpreter" not in _requested(item.config):
        pytest.skip(f"needs the interpreter backend, unavailable here ({reason}); tox -e cpu runs it")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", _requested(metafunc.config), indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest):
    """The backend under test, forced for the test's duration; tensors go on its device."""
    b = xkernels.get_backend(request.param)
    with xkernels.use_backend(b.name):
        yield b


@pytest.fixture
def device(backend) -> torch.device:
    return torch.device(backend.device_type)


SEED = int(os.environ.get("XKERNELS_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
os.environ["XKERNELS_TEST_SEED"] = str(SEED)  # pytest-xdist's workers (started later) draw the same inputs


def pytest_report_header(config: pytest.Config) -> str:
    return f"xkernels test backends: {', '.join(_requested(config))}; seed {SEED} (XKERNELS_TEST_SEED to replay)"


@pytest.fixture(autouse=True)
def _seed(request: pytest.FixtureRequest) -> None:
    """Fresh random inputs every run; XKERNELS_TEST_SEED replays one."""
    import zlib

    torch.manual_seed(SEED ^ zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def tma_interpreter(monkeypatch):
    """The registered interpreter backend with the TMA path on and a 3-SM device, selected."""
    from xkernels import dispatch
    from xkernels.ops import linear, matmul
    from xkernels.ops.matmul import feed_forward, pre_activation

    be = dispatch.get_backend("interpreter")
    if be.unavailable_reason():
        pytest.skip(be.unavailable_reason())
    monkeypatch.setattr(be, "tensor_descriptors", lambda device=None: True)
    monkeypatch.setattr(be, "compute_units", lambda device=None: 3)
    linear._forget()
    matmul._forget()
    pre_activation.forget()
    feed_forward.forget()
    with xkernels.use_backend("interpreter"):
        yield be
    linear._forget()
    matmul._forget()
    pre_activation.forget()
    feed_forward.forget()
