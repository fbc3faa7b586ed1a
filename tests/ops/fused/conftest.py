"""Fixtures of the fused ops' tests."""

from __future__ import annotations

import pytest
import torch

from xkernels.ops.fused import gated_linear_plan


@pytest.fixture
def nan_memory(monkeypatch):
    """Every buffer the element-wise passes allocate (``gated_linear_plan._empty``: the gate pass's,
    the routing passes') starts as NaN. ``test_gated_linear.py`` has its own, wider one."""
    monkeypatch.setattr(gated_linear_plan, "_empty",
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))
