"""Autocast (``ops/autocast.py``): under ``torch.autocast`` the matmul-like ops compute in the
autocast dtype as PyTorch's ``F.linear`` / ``torch.matmul`` do, on every backend, the native route
table's repeats included; the other ops and the residual keep their dtypes; patched modules give
what the unpatched ones give under autocast, gradients reaching the fp32 parameters (whole patched
models under autocast, their blocks fused: tests/test_blocks.py). Autocast runs on the CPU here
(``torch.autocast("cpu", dtype=torch.bfloat16)``); the kernel backends run the real kernels on
CPU tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xkernels
from helpers import assert_close, rand
from xkernels.backends import native
from xkernels.ops import add, gated_linear, linear, matmul


def _autocast(device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _leaf(t):
    return t.detach().clone().requires_grad_()


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_linear_and_matmul_compute_in_the_autocast_dtype(backend, device, grad):
    """fp32 operands under autocast: a bf16 result like PyTorch's, its values PyTorch's bf16 GEMM
    (within bf16 tolerance of float64 on the cast operands), fp32 gradients for fp32 leaves; the
    second call (a repeat, the native table's where it is loaded) too, also after the same
    signature ran without autocast (a table route of the fp32 call must not answer)."""
    if native.setting() != "0" and backend.runs_triton:
        native.module(wait=True)
    x, w, b = rand((48, 40), torch.float32, device), rand((72, 40), torch.float32, device), rand((72,), torch.float32,
                                                                                                   device)
    for op, args, ref in ((linear, (x, w, b), lambda *a: F.linear(*a)),
                          (matmul, (x, w.t()), lambda *a: torch.matmul(*a))):
        op._forget()
        for round_ in range(3):
            if round_ == 1:  # the fp32 signature without autocast first: a table route of its own
                assert op(*args).dtype == torch.float32
            leaves = [_leaf(t) if grad else t for t in args]
            with torch.set_grad_enabled(grad), _autocast(device):
                got = op(*leaves)
                want = ref(*args)
            assert got.dtype == want.dtype == torch.bfloat16, (op.name, got.dtype)
            cast64 = [t.to(torch.bfloat16).double() for t in args]
            assert_close(got.detach(), ref(*cast64), torch.bfloat16, scale=4.0)
            if grad:
                got.float().sum().backward()
                for leaf in leaves:
                    assert leaf.grad is not None and leaf.grad.dtype == torch.float32
        op._forget()


def test_the_residual_is_not_cast_and_float64_is_left_alone(backend, device):
    """``linear(..., residual=r)`` under autocast is ``F.linear(...) + r``: an fp32 residual promotes
    the bf16 GEMM's result to fp32; float64 operands are not cast (autocast leaves them); the
    element-wise ops keep their inputs' dtypes."""
    x, w, r = rand((32, 24), torch.float32, device), rand((40, 24), torch.float32, device), rand((32, 40), torch.float32,
                                                                                                   device)
    with _autocast(device):
        got = linear(x, w, residual=r)
        want = F.linear(x, w) + r
        assert got.dtype == want.dtype == torch.float32
        assert linear(x.double(), w.double()).dtype == torch.float64
        assert add(x, x).dtype == torch.float32
    gemm = F.linear(x.to(torch.bfloat16).double(), w.to(torch.bfloat16).double())
    # the GEMM rounded to bf16, then the fp32 residual added: got - r is that GEMM within bf16's tolerance
    torch.testing.assert_close((got - r).double(), gemm, rtol=2e-2, atol=2e-2)


def test_gated_linear_computes_in_the_autocast_dtype(backend, device):
    x = rand((16, 32), torch.float32, device)
    wg, wu = rand((48, 32), torch.float32, device), rand((48, 32), torch.float32, device)
    with _autocast(device):
        got = gated_linear(x, wg, wu, activation="silu")
        want = F.silu(F.linear(x, wg)) * F.linear(x, wu)
    assert got.dtype == want.dtype == torch.bfloat16
    b16 = [t.to(torch.bfloat16).double() for t in (x, wg, wu)]
    assert_close(got, F.silu(F.linear(b16[0], b16[1])) * F.linear(b16[0], b16[2]), torch.bfloat16, scale=8.0)


def test_the_native_table_declines_only_calls_autocast_would_cast(backend, device):
    """Under autocast, fp32 operands never reach the table's route (declined: the Python front door
    casts them), while operands already in the autocast dtype (what a patched module passes: it
    casts first) keep their repeats in the table."""
    if native.setting() == "0" or not backend.runs_triton:
        pytest.skip("no native route table here (XKERNELS_NATIVE=0, or a backend running PyTorch)")
    assert native.module(wait=True) is not None, native.unavailable_reason()
    x, w = rand((48, 40), torch.bfloat16, device), rand((72, 40), torch.bfloat16, device)
    linear._forget()
    linear._native.take_hits()
    with _autocast(device):
        for _ in range(3):
            assert linear(x, w).dtype == torch.bfloat16
        assert linear._native.take_hits() >= 1  # the bf16 call's repeats
        for _ in range(3):
            assert linear(x.float(), w.float()).dtype == torch.bfloat16
        assert linear._native.take_hits() == 0  # declined each time: the Python front door casts and runs them
    linear._forget()


def test_a_training_call_the_policy_gives_pytorch_leaves_the_casts_to_autocast(backend, device, monkeypatch):
    """Where ``xkernels.nn``'s training policy runs ``F.linear`` (``training_pays`` false), a
    patched layer under autocast hands its fp32 operands to ``F.linear`` itself: autocast casts them
    in C++ (no cast from Python), and the result is ``nn.Linear``'s bit for bit."""
    import xkernels.nn as xnn
    from xkernels.ops import autocast as ac

    monkeypatch.setattr(xnn, "_trains_through_xkernels", lambda x, w: False)
    casts = []
    real = ac.cast_all
    monkeypatch.setattr(ac, "cast_all", lambda values: casts.append(1) or real(values))
    torch.manual_seed(0)
    lin = torch.nn.Linear(40, 72).to(device)
    mod = xkernels.nn.Linear.from_linear(lin, "gelu")
    x = rand((2, 9, 40), torch.float32, device).requires_grad_()
    with _autocast(device):
        got = mod(x)
        want = F.gelu(lin(x))
    assert not casts and got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_compiled_calls_cast_too(backend, device):
    """``torch.compile(fullgraph=True)`` of a function calling the ops under autocast: the custom
    op gets no cast from the compiler, so the front door casts while tracing; bf16 results as
    eager gives, fp32 gradients, and fp32 again without autocast (no graph reused across the two)."""
    torch._dynamo.reset()
    x, w = rand((8, 32), torch.float32, device).requires_grad_(), rand((16, 32), torch.float32, device)
    w.requires_grad_()
    fns = {linear: torch.compile(lambda x, w: linear(x, w), fullgraph=True),
           matmul: torch.compile(lambda x, w: matmul(x, w.t()), fullgraph=True)}
    for op, fn in fns.items():
        with _autocast(device):
            got = fn(x, w)
        assert got.dtype == torch.bfloat16, op.name
        b16 = [t.detach().to(torch.bfloat16).double() for t in (x, w)]
        assert_close(got.detach(), b16[0] @ b16[1].t(), torch.bfloat16, scale=4.0)
        x.grad = w.grad = None
        got.float().sum().backward()
        assert x.grad.dtype == w.grad.dtype == torch.float32
        assert fn(x, w).dtype == torch.float32, op.name
    torch._dynamo.reset()
