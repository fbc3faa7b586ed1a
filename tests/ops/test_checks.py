"""ops/checks.py: the argument checks every op shares, against PyTorch's own rules."""

from __future__ import annotations

import itertools

import pytest
import torch

from xkernels.ops import checks


@pytest.mark.parametrize("shapes", [((3, 1, 5), (4, 1)), ((2, 3), (3,)), ((1,), (7, 1, 2)), ((), (2, 2)),
                                    ((0, 3), (1, 3)), ((2, 3), (2, 3))])
def test_broadcast_shape_is_torchs(shapes):
    named = {f"t{i}": torch.Size(s) for i, s in enumerate(shapes)}
    assert checks.broadcast_shape("add", named) == torch.broadcast_shapes(*shapes)


def test_broadcast_shape_names_the_arguments_and_their_shapes():
    with pytest.raises(ValueError, match=r"xkernels.ops.add: shapes do not broadcast: 'x' \(3, 4\), 'y' \(5,\)"):
        checks.broadcast_shape("add", {"x": torch.Size((3, 4)), "y": torch.Size((5,))})


@pytest.mark.parametrize("dtype,alpha,ok", [
    (torch.float32, 2, True), (torch.float32, 0.5, True), (torch.int32, 2, True), (torch.int32, 0.5, False),
    (torch.float32, True, False), (torch.bool, True, True), (torch.float32, 1j, False),
    (torch.complex64, 1j, True), (torch.float32, "2", False)])
def test_check_alpha_follows_torch_add(dtype, alpha, ok):
    """The same verdict as ``torch.add(..., alpha=...)``."""
    x = torch.ones(2, dtype=dtype)
    try:
        torch.add(x, x, alpha=alpha)
        torch_ok = True
    except (TypeError, RuntimeError):
        torch_ok = False
    assert torch_ok == ok, "the expectation disagrees with torch itself"
    if ok:
        checks.check_alpha("add", alpha, dtype)
    else:
        with pytest.raises(TypeError, match="xkernels.ops.add: 'alpha'"):
            checks.check_alpha("add", alpha, dtype)


def test_common_device_lets_cpu_scalars_join_and_names_devices():
    x, s = torch.ones(2, 2, device="meta"), torch.tensor(3.0)
    assert checks.common_device("add", {"x": x, "alpha": s}) == torch.device("meta")
    assert checks.common_device("add", {"s": s}) == torch.device("cpu")
    with pytest.raises(ValueError, match="'x' on meta, 'y' on cpu"):
        checks.common_device("add", {"x": x, "y": torch.ones(2)})


def test_require_tensor_names_argument_and_what_came():
    with pytest.raises(TypeError, match=r"argument 'weight' must be a torch.Tensor, got list \[1, 2\]"):
        checks.require_tensor("linear", "weight", [1, 2])


def test_check_out_accepts_exact_and_in_place_refuses_the_rest():
    x = torch.randn(4, 6)
    shape, dt, dev = torch.Size((4, 6)), torch.float32, torch.device("cpu")
    assert checks.check_out("add", None, shape, dt, dev, {"x": x}) is None
    fresh = torch.empty(4, 6)
    assert checks.check_out("add", fresh, shape, dt, dev, {"x": x}) is fresh
    assert checks.check_out("add", x, shape, dt, dev, {"x": x}) is x  # in place: the same view
    with pytest.raises(ValueError, match=r"'out' has shape \(4, 5\), the result has shape \(4, 6\)"):
        checks.check_out("add", torch.empty(4, 5), shape, dt, dev, {"x": x})
    with pytest.raises(TypeError, match="'out' has dtype torch.float16"):
        checks.check_out("add", torch.empty(4, 6, dtype=torch.float16), shape, dt, dev, {"x": x})
    with pytest.raises(ValueError, match="internal overlap"):
        checks.check_out("add", torch.empty(6).expand(4, 6), shape, dt, dev, {"x": x})
    big = torch.randn(5, 6)
    with pytest.raises(ValueError, match="partially overlaps input 'x'"):
        checks.check_out("add", big[1:], shape, dt, dev, {"x": big[:4]})
    assert checks.check_out("add", big[:4], shape, dt, dev, {"y": big[4:]}) is not None  # disjoint rows


def test_overlap_is_by_byte_span_within_one_storage():
    buf = torch.randn(24)
    for (a0, a1), (b0, b1) in itertools.product([(0, 8), (4, 12), (12, 24)], repeat=2):
        a, b = buf[a0:a1], buf[b0:b1]
        assert checks._overlaps(a, b) == (a0 < b1 and b0 < a1)
    assert not checks._overlaps(torch.randn(4), torch.randn(4))
    assert not checks._overlaps(buf[:0], buf)
