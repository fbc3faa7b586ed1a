"""``xkernels.linear_forms``: ``nn.Linear`` subclasses whose forward is ``F.linear``'s are swapped by
``patch()`` like ``nn.Linear`` (Falcon's ``FalconLinear``); any other subclass is left, reported."""

from __future__ import annotations

import linecache

import pytest
import torch
import torch.nn.functional as F

import xkernels
from helpers import patch_matches_float64, require_transformers
from xkernels.linear_forms import computes_linear
from xkernels.mask_decisions import FUSION as MASKS


class Functional(torch.nn.Linear):
    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        """F.linear, annotated and documented."""
        return F.linear(inp, self.weight, self.bias)


class Matmul(torch.nn.Linear):  # FalconLinear's form, other names
    def forward(self, hidden):
        out = hidden @ self.weight.T
        if self.bias is None:
            return out
        return out + self.bias


class Scaled(torch.nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight, self.bias) * 2


class AddsInput(torch.nn.Linear):
    def forward(self, x):
        out = x @ self.weight.T
        if self.bias is None:
            return out
        return out + x


class WithAttribute(Functional):
    scale = 2.0  # read by other code, maybe


class OwnInit(torch.nn.Linear):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.extra = 1

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Marker(torch.nn.Linear):
    """nn.Linear's forward, a type of its own (as NonDynamicallyQuantizableLinear): others read it."""


class KeywordOnly(torch.nn.Linear):
    def forward(self, x, *, scale=1.0):
        return F.linear(x, self.weight, self.bias)


class _NotTorch:
    @staticmethod
    def linear(x, w, b):
        return x


def test_a_form_calling_through_another_F_is_not_read_as_linear():
    """The same source, with ``F`` bound to something other than torch.nn.functional in the
    forward's module, is no linear layer; with PyTorch's ``F`` it is."""
    source = "class Other(torch.nn.Linear):\n    def forward(self, x):\n        return F.linear(x, self.weight, self.bias)\n"
    linecache.cache["<other-F>"] = (len(source), None, source.splitlines(True), "<other-F>")  # getsource reads it
    code = compile(source, "<other-F>", "exec")
    for bound, expected in ((_NotTorch, False), (F, True)):
        scope = {"torch": torch, "F": bound}
        exec(code, scope)  # noqa: S102
        assert computes_linear(scope["Other"]) is expected


@pytest.mark.parametrize("cls, expected", [
    (Functional, True), (Matmul, True), (Scaled, False), (AddsInput, False), (WithAttribute, False),
    (OwnInit, False), (Marker, False), (KeywordOnly, False), (torch.nn.Linear, False), (torch.nn.Conv1d, False),
    (torch.nn.modules.linear.NonDynamicallyQuantizableLinear, False)])
def test_which_subclasses_compute_linear(cls, expected):
    assert computes_linear(cls) is expected


def test_falcon_linear_is_read_as_linear():
    tf = require_transformers()
    from transformers.models.falcon.modeling_falcon import FalconLinear

    assert tf is not None and computes_linear(FalconLinear)


def test_patch_swaps_such_subclasses_fusing_their_activation(backend, device):
    """In a Sequential: the F.linear-form subclass followed by GELU becomes one fused xkernels
    linear, the matmul-form one a plain one; the scaled one is left with its reason. Output and
    gradients match the float64 model; undo() gives back the subclass instances."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(Functional(16, 32), torch.nn.GELU(), Matmul(32, 24, bias=False), Scaled(24, 8)).to(device)
    layers = list(model)
    report = patch_matches_float64(model, torch.randn(4, 16, device=device))
    assert [(e.name, e.old, e.activation) for e in report.replaced] == [
        ("0", "Functional", "gelu"), ("2", "Matmul", None)]
    assert isinstance(model[0], xkernels.nn.Linear) and model[0].activation == "gelu"
    assert isinstance(model[1], torch.nn.Identity) and isinstance(model[2], xkernels.nn.Linear)
    assert [(e.name, e.reason) for e in report.left] == [
        ("3", "a subclass of Linear: its forward or its users may differ")]
    report.undo()
    assert list(model) == layers


def test_falcon_feed_forward_and_linears_fuse():
    """Falcon's MLP (two FalconLinear around a GELU) is a feed-forward block now, every FalconLinear
    a swapped layer; nothing is left (tests/test_patch_families.py checks its numbers)."""
    tf = require_transformers()
    cfg = tf.FalconConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64,
                          new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False)
    report = xkernels.patch(tf.FalconForCausalLM(cfg))
    assert not report.left, report
    assert report.counts() == {"feed-forward (training)": 2, "rotary embedding": 2, "linear + activation": 2,
                               "linear": 7, MASKS: 1}
    assert {e.old for e in report.replaced} == {"FalconLinear", "Linear"}
