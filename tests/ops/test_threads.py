"""Calls from many threads at once, on every test backend: each thread's results match PyTorch
(float64 reference), inputs are left unchanged, ``use_backend`` is per thread, and the op front
door's caches (plans, hot entries) stay right while threads fill them at once.

Reported: 8 threads calling ``broadcast`` under ``use_backend("interpreter")`` failed in Triton's
interpreter ("Did you forget to add @triton.jit?"), which patches module globals while a kernel
runs; the interpreter backends now serialize their launches (``backends/interpreter.py``)."""

from __future__ import annotations

import threading

import pytest
import torch

import xkernels
from helpers import assert_close, poisoned, rand
from xkernels import tuning
from xkernels.ops import add, broadcast, linear, matmul

THREADS = 8
DTYPES = (torch.float32, torch.float16)


def _calls(i: int, dtype: torch.dtype, device: torch.device) -> tuple[list, tuple, list]:
    """Thread ``i``'s calls (op name, a thunk, the float64 reference, tolerance scale): shapes
    differ per thread, so every thread makes plans of its own while the others do."""
    m, n, k = 8 + i, 24 + i, 16 + i
    x, bias, y = rand((m, n), dtype, device), rand((n,), dtype, device), rand((m, n), dtype, device)
    a, b, w = rand((m, k), dtype, device), rand((k, n), dtype, device), rand((n, k), dtype, device)
    inputs = (x, bias, y, a, b, w)
    copies = [t.clone() for t in inputs]
    out = poisoned((m, n), dtype, device)

    def broadcast_out() -> torch.Tensor:
        out.fill_(float("nan"))
        got = broadcast(x, bias, out=out)
        assert got is out
        return got

    d = [t.double().cpu() for t in (x, bias, y, a, b, w)]
    scale = max(1.0, k ** 0.5)
    calls = [
        ("broadcast", lambda: broadcast(x, bias), d[0] + d[1], 1.0),
        ("broadcast out=", broadcast_out, d[0] + d[1], 1.0),
        ("add", lambda: add(x, y), d[0] + d[2], 1.0),
        ("add alpha", lambda: add(x, y, alpha=2), d[0] + 2 * d[2], 2.0),
        ("matmul", lambda: matmul(a, b), d[3] @ d[4], scale),
        ("linear", lambda: linear(a, w, bias, "relu"), torch.relu(d[3] @ d[5].T + d[1]), scale),
    ]
    return [(name, fn, ref, s) for name, fn, ref, s in calls], inputs, copies


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_many_threads_call_several_ops_at_once(backend, device, dtype):
    """Each thread runs every op twice (the second call takes its hot entry) under its own
    ``use_backend``, all starting together; the main thread meanwhile has another override."""
    for op in (add, broadcast, matmul, linear):  # cold caches: threads make the plans at once
        op._forget()
    barrier = threading.Barrier(THREADS)
    failures: list[str] = []
    seen: dict[int, str] = {}

    def worker(i: int) -> None:
        try:
            with xkernels.use_backend(backend.name):
                calls, inputs, copies = _calls(i, dtype, device)
                seen[i] = add.explain(inputs[0], inputs[2]).backend
                barrier.wait()
                for _ in range(2):
                    for name, fn, ref, scale in calls:
                        try:
                            assert_close(fn(), ref, dtype, scale=scale)
                        except AssertionError as exc:
                            failures.append(f"thread {i} {name}: {str(exc)[:300]}")
                for t, c in zip(inputs, copies):
                    assert torch.equal(t, c), f"thread {i}: an input was modified"
        except Exception as exc:  # noqa: BLE001 - reported below with the thread that raised it
            failures.append(f"thread {i}: {type(exc).__name__}: {str(exc)[:300]}")
            barrier.abort()

    other = "interpreter" if backend.name != "interpreter" else "cpu"
    with xkernels.use_backend(other):  # the main thread's override is not the workers'
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert xkernels.dispatch.override_name() == other
    assert failures == []
    assert seen == dict.fromkeys(range(THREADS), backend.name)


def test_use_backend_and_forced_configs_are_per_thread():
    """A thread's ``use_backend`` and ``tuning.force`` are invisible to another thread running at
    the same time (context variables), and each is undone when its block ends."""
    barrier = threading.Barrier(2)
    got: dict[str, tuple] = {}
    x = torch.randn(8, 64)

    def worker(name: str | None, cfg: dict | None) -> None:
        if name is None:
            barrier.wait()
            got["none"] = (xkernels.dispatch.override_name(), tuning.forced_config(), broadcast.explain(x, x[0]).backend)
            barrier.wait()
            return
        with xkernels.use_backend(name), tuning.force(cfg):
            barrier.wait()  # the other thread looks while this one's override is in effect
            got[name] = (xkernels.dispatch.override_name(), tuning.forced_config(), broadcast.explain(x, x[0]).backend)
            barrier.wait()
        got[name + " after"] = (xkernels.dispatch.override_name(), tuning.forced_config())

    threads = [threading.Thread(target=worker, args=a) for a in (("interpreter", {"BLOCK_M": 8, "BLOCK_N": 64}),
                                                                  (None, None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["interpreter"][0] == "interpreter" and got["interpreter"][1] == {"BLOCK_M": 8, "BLOCK_N": 64}
    assert got["interpreter"][2] == "interpreter"
    assert got["none"] == (xkernels.dispatch._env_backend, None, broadcast.explain(x, x[0]).backend)
    assert got["interpreter after"] == (xkernels.dispatch._env_backend, None)
