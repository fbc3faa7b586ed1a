"""ops/signature.py: parameters, what a signature key holds of each argument, and binding."""

from __future__ import annotations

import pytest
import torch

from xkernels.ops import add, linear
from xkernels.ops.signature import NO_KEY, REQUIRED, Param, Signature, key_of


class _Toy(Signature):
    """x, y required; scale=1.0 positional; mode="a" keyword-only."""

    name = "toy"
    params = (Param("x"), Param("y"), Param("scale", 1.0, key="type"), Param("mode", "a", positional=False,
                                                                                key="value"))

    def check(self, *args, **kwargs):
        raise TypeError(f"xkernels.ops.toy: bad arguments {args} {kwargs}")


def test_canonical_fills_defaults_in_params_order_and_refuses_what_does_not_fit():
    t = _Toy()
    assert t.canonical((1, 2), {}) == (1, 2, 1.0, "a")
    assert t.canonical((1, 2, 3.0), {}) == (1, 2, 3.0, "a")
    assert t.canonical((1,), {"y": 2, "mode": "b"}) == (1, 2, 1.0, "b")
    assert t.canonical((1, 2), {"scale": 0.5}) == (1, 2, 0.5, "a")
    for args, kwargs in [((1,), {}), ((1, 2, 3.0, "b"), {}), ((1, 2), {"x": 1}), ((1, 2), {"nope": 1}),
                         ((1,), {"mode": "b"})]:
        assert t.canonical(args, kwargs) is None, (args, kwargs)


def test_split_is_the_inverse_of_canonical():
    t = _Toy()
    canon = t.canonical((1,), {"y": 2, "mode": "b"})
    args, kwargs = t.split(canon)
    assert (args, kwargs) == ((1, 2, 1.0), {"mode": "b"})
    assert t.canonical(args, kwargs) == canon


def test_bind_raises_the_checks_error_and_signature_reads_like_python():
    t = _Toy()
    with pytest.raises(TypeError, match="xkernels.ops.toy: bad arguments"):
        t._bind((1,), {})
    assert t.signature() == "toy(x, y, scale=1.0, *, mode='a')"
    assert "activation" in linear.signature() and linear.signature().startswith("linear(x, weight")


def test_keyword_forms_are_only_where_every_other_parameter_defaults():
    """``op(a, b, name=value)`` has its own key form only for a parameter after the first two
    when no other parameter past them is required: add's alpha has one; with a third required
    parameter ``c``, only ``c`` has one (``d`` would leave ``c`` unbound)."""
    assert "alpha" in add._keyword_forms

    class _ThreeRequired(Signature):
        name = "three"
        params = (Param("a"), Param("b"), Param("c"), Param("d", 0))

    assert set(_ThreeRequired()._keyword_forms) == {"c"}
    assert _ThreeRequired()._n_required == 3 and _ThreeRequired()._defaults[:3] == (REQUIRED,) * 3


def test_key_of_holds_layout_value_alpha_and_type():
    x = torch.randn(3, 4)
    assert key_of(x, "layout") == (x.shape, x.stride(), x.dtype, x.device)
    assert key_of(x.t(), "layout") != key_of(x, "layout")  # strides are part of it
    assert key_of(2.5, "layout") is float and key_of(None, "layout") is type(None)
    assert key_of("gelu", "value") == "gelu"
    assert key_of(1, "alpha") == (int, True) and key_of(2.0, "alpha") == (float, False)
    assert key_of(torch.tensor(1.0), "alpha") is NO_KEY  # a tensor alpha has no route
    assert key_of(0.01, "type") is float
