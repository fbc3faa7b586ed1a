"""Helpers for op tests: float64 reference comparison, NaN-poisoned outputs, input guards."""

from __future__ import annotations

import torch

# max |err| <= atol + rtol * |ref|; low precision compared against a float64 reference.
TOL = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (8e-3, 8e-3),
    torch.float32: (1e-5, 1.3e-6),
    torch.int32: (0, 0),
    torch.int64: (0, 0),
    torch.float64: (1e-12, 1e-12),
}


def rand(shape, dtype, device) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=torch.float32).to(dtype).to(device)
    return torch.randint(-1000, 1000, shape, dtype=dtype).to(device)


def poisoned(shape, dtype, device) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, -123456789 if dtype == torch.int64 else -12345, dtype=dtype, device=device)


def assert_close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, scale: float = 1.0):
    """``ref`` is the float64 (or exact int) reference; ``dtype`` picks the tolerance."""
    dtype = dtype or got.dtype
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == dtype, (got.dtype, dtype)
    if not dtype.is_floating_point:
        assert torch.equal(got.cpu(), ref.cpu().to(dtype)), "integer result differs"
        return
    g, r = got.detach().cpu().double(), ref.detach().cpu().double()
    assert not torch.isnan(g).any() or torch.isnan(r).any(), "NaN left in output (element not written?)"
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(g, r, rtol=rtol * scale, atol=atol * scale, equal_nan=True)


class Unchanged:
    """Context manager asserting the given tensors are bit-identical after the block."""

    def __init__(self, *tensors):
        self.tensors = [t for t in tensors if isinstance(t, torch.Tensor)]

    def __enter__(self):
        self.copies = [t.clone() for t in self.tensors]
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            for t, c in zip(self.tensors, self.copies):
                assert torch.equal(t, c), "an input was modified"
