"""ops/route.py: the typed routes, ``check_built`` and a module's ``RouteCache``."""

from __future__ import annotations

import pytest
import torch

import xkernels
from helpers import rand
from xkernels import tuning
from xkernels.ops import add
from xkernels.ops.route import AtenRoute, KernelRoute, PluginRoute, RouteCache, TorchRoute, VendorRoute, check_built


def test_route_kinds_say_how_they_record_autograd_and_repeat():
    run = lambda *a: None  # noqa: E731
    assert not KernelRoute(run).records_autograd and KernelRoute(run).autograd_run is None
    assert VendorRoute(run).records_autograd and VendorRoute(run).autograd_run is run
    other = lambda *a: 1  # noqa: E731
    assert VendorRoute(run, autograd_run=other).autograd_run is other
    assert AtenRoute(run).aten_call and not VendorRoute(run).aten_call
    assert check_built("add", "k", KernelRoute(run)) is not None and check_built("add", "k", None) is None
    for bad in (PluginRoute(run), TorchRoute(run), run):
        with pytest.raises(TypeError, match="make_hot must return a KernelRoute, VendorRoute or AtenRoute"):
            check_built("add", "k", bad)


@pytest.fixture
def counted_calls(monkeypatch):
    """How often ``add`` took its front door (``call_no_grad``) from a RouteCache."""
    calls = []
    real = add.call_no_grad
    monkeypatch.setattr(add, "call_no_grad", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    add._forget()
    yield calls
    add._forget()


def _key(x, y):
    return (x.shape, x.stride(), x.dtype, x.device, y.shape, y.stride(), y.dtype, y.device)


def test_route_cache_adopts_the_route_of_a_miss_and_repeats_without_the_front_door(backend, device, counted_calls):
    cache = RouteCache(add)
    x, y = rand((4, 8), torch.float32, device), rand((4, 8), torch.float32, device)
    torch.testing.assert_close(cache.run(_key(x, y), (x, y, None, 1)), x + y)
    assert len(counted_calls) == 1
    x2, y2 = rand((4, 8), torch.float32, device), rand((4, 8), torch.float32, device)
    torch.testing.assert_close(cache.run(_key(x2, y2), (x2, y2, None, 1)), x2 + y2)
    # a backend that runs Triton left a route: the repeat ran it; one running PyTorch has none
    assert len(counted_calls) == (1 if backend.runs_triton else 2)
    assert len(cache.routes) == (1 if backend.runs_triton else 0)


def test_route_cache_forgets_with_the_op_and_steps_aside_when_forced(backend, device, counted_calls):
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no routes to cache")
    cache = RouteCache(add)
    x, y = rand((4, 8), torch.float32, device), rand((4, 8), torch.float32, device)
    cache.run(_key(x, y), (x, y, None, 1))
    assert len(cache.routes) == 1
    add._forget()  # a plugin registered: routes may be stale
    cache.run(_key(x, y), (x, y, None, 1))
    assert len(counted_calls) == 2 and len(cache.routes) == 1  # emptied, then adopted again
    with tuning.force({"BLOCK": 256}):
        torch.testing.assert_close(cache.run(_key(x, y), (x, y, None, 1)), x + y)
    assert len(counted_calls) == 3  # a forced config takes the front door, never a cached route


def test_route_cache_keys_include_the_backend_override(device, counted_calls):
    """The same key under another ``use_backend`` is another entry (the route is the backend's)."""
    if device.type != "cpu":
        pytest.skip("use_backend('interpreter') needs cpu tensors")
    cache = RouteCache(add)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with xkernels.use_backend("interpreter"):
        cache.run(_key(x, y), (x, y, None, 1))
    with xkernels.use_backend("interpreter-npu"):
        torch.testing.assert_close(cache.run(_key(x, y), (x, y, None, 1)), x + y)
    assert len(counted_calls) == 2 and len(cache.routes) == 2


def test_route_cache_pickles_empty():
    import pickle

    cache = RouteCache(add)
    cache.routes["k"] = KernelRoute(lambda *a: None)
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.op is add and copy.routes == {}
