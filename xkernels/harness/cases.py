"""What each op is called with: the accuracy and benchmark case lists.

A :class:`~xkernels.harness.case.Case` names an op, its operands (shape, dtype, memory layout)
and a layout label; ``case.make_inputs(device, seed)`` builds fresh random tensors for one call
(:mod:`xkernels.harness.case`). Every case carries size tags:

* ``quick``: small layouts users meet (CI runs these under the Triton interpreter on 2 cores);
* ``full``: ``quick`` plus the seed sizes (256² … 8192², bias adds over (512,)*3 and (1024,)*3);
* ``small`` / ``medium`` / ``large``: the benchmark sizes (every benchmark case is also ``full``);
* ``models``: the real-model shape corpus (:mod:`~xkernels.harness.models`: BERT-base, GPT-2,
  Llama-3-8B, ViT-B/16 layers, ResNet-50 channel biases, ...), each case naming its models.

``OPS[op].torch_fn`` is the same work done by PyTorch (:mod:`xkernels.harness.torch_ops`): the
reference, the expected result shape and dtype, and the benchmark baseline. This module
re-exports :class:`Case`, :class:`T`, :class:`Inputs`, :data:`OPS` and their helpers, so
``from xkernels.harness.cases import Case, OPS`` keeps working.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

# a case and PyTorch's ops, re-exported: ``from xkernels.harness.cases import Case, OPS`` works
from xkernels.harness.case import INT_RANGE as INT_RANGE
from xkernels.harness.case import Case, T
from xkernels.harness.case import Inputs as Inputs
from xkernels.harness.case import expected_result as expected_result
from xkernels.harness.case import random_tensor as random_tensor
from xkernels.harness.heldout import SIZE_TAG as HELDOUT
from xkernels.harness.heldout import heldout_cases
from xkernels.harness.models import SIZE_TAG, corpus, gemm_layers, model_names
from xkernels.harness.torch_ops import OP_NAMES, OPS
from xkernels.harness.torch_ops import OpSpec as OpSpec
from xkernels.ops.fused.gated_linear import ACTIVATIONS as GATED_ACTIVATIONS

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INT_DTYPES = (torch.int32, torch.int64)
SIZES = ("quick", "full", "small", "medium", "large", "models", "heldout")
BENCH_SIZES = ("small", "medium", "large")


# -- the case lists -----------------------------------------------------------------------------
Q = frozenset({"quick", "full"})


def _bench(size: str) -> frozenset[str]:
    return frozenset({"full", size})


SEEDS = ((256, "small"), (1024, "small"), (2048, "medium"), (4096, "medium"), (8192, "large"))
CUBES = ((512, "medium"), (1024, "large"))


def _other_float(d: torch.dtype) -> torch.dtype:
    return torch.float16 if d == torch.float32 else torch.float32


def _elementwise_common(op: str, d: torch.dtype, second: str) -> list[Case]:
    """Layouts shared by broadcast (``second`` = bias) and add (``second`` = y)."""
    C = lambda *a, layout, **kw: Case(op, a, layout, Q, **kw)  # noqa: E731
    cases = [C(T((rows, n), d), T((n,), d), layout=f"{second}[N], N={n}")
             for rows, n in ((5, 7), (3, 1000), (2, 4097), (2, 65539))]
    cases += [
        C(T((2, 3, 5, 7), d), T((3, 1, 1), d), layout="per-channel (C,1,1) over NCHW"),
        C(T((2, 4, 16, 16), d), T((2, 1, 1, 16), d), layout="mask [B,1,1,S] over [B,H,S,S]"),
        C(T((6, 33), d), T((1, 33), d), layout=f"{second} (1,D)"),
        C(T((5, 9), d), T((1,), d), layout="single element"),
        C(T((4, 5), d), T((), d), layout=f"0-d {second}"),
        C(T((), d), T((), d), layout="0-d"),
        C(T((0, 8), d), T((8,), d), layout="empty"),
        C(T((17, 33), d, "transposed"), T((33,), d), layout="x transposed"),
        C(T((6, 40), d, "strided"), T((40,), d), layout="x step-sliced [..., ::2]"),
        C(T((6, 40), d), T((40,), d, "strided"), layout=f"{second} step-sliced"),
        C(T((6, 40), d), T((6, 40), d, "expanded"), layout=f"{second} expanded (stride 0)"),
        C(T((2, 3, 4, 5, 6), d), T((3, 1, 5, 1), d), layout="5-D, not collapsible"),
        C(T((5, 1000), d), T((1000,), d), layout="out=", out="new"),
        C(T((5, 1000), d), T((1000,), d), layout="in place (out=x)", out="inplace"),
    ]
    if d.is_floating_point:
        o = _other_float(d)
        cases.append(C(T((5, 33), d), T((33,), o), layout=f"{second} {str(o)[6:]} (promotes)"))
    else:
        cases += [C(T((5, 33), d), T((33,), torch.int64 if d == torch.int32 else torch.int32),
                    layout=f"{second} other int (promotes)"),
                  C(T((5, 33), d), T((33,), torch.float32), layout=f"{second} float32 (int+float)")]
    return cases


def broadcast_cases(d: torch.dtype) -> list[Case]:
    cases = _elementwise_common("broadcast", d, "bias")
    for n, size in SEEDS:
        cases.append(Case("broadcast", (T((n, n), d), T((n,), d)), "bias[N]", _bench(size)))
    for n, size in CUBES:
        cases.append(Case("broadcast", (T((n, n, n), d), T((n,), d)), "bias[N]", _bench(size)))
    cases.append(Case("broadcast", (T((64, 1024), d), T((1024,), d)), "form: broadcast(x, b, out=o)", _bench("small"),
                      out="new"))
    cases += [Case("broadcast", (T((32, 64, 56, 56), d), T((64, 1, 1), d)), "per-channel (C,1,1) over NCHW",
                   _bench("medium")),
              Case("broadcast", (T((8, 16, 512, 512), d), T((8, 1, 1, 512), d)),
                   "mask [B,1,1,S] over [B,H,S,S]", _bench("medium"))]
    return cases


def add_cases(d: torch.dtype) -> list[Case]:
    C = lambda *a, layout, **kw: Case("add", a, layout, Q, **kw)  # noqa: E731
    num = 2.5 if d.is_floating_point else 3
    alpha = 0.5 if d.is_floating_point else 3
    cases = [C(T((n,), d), T((n,), d), layout="same shape, contiguous") for n in (7, 1000, 4097, 65539)]
    cases += _elementwise_common("add", d, "y")
    cases += [
        C(T((5, 1, 7), d), T((1, 3, 7), d), layout="broadcast both sides"),
        C(T((3, 1000), d), num, layout="Python scalar right"),
        Case("add", (num, T((3, 1000), d)), "Python scalar left", Q),
        C(T((3, 1000), d), T((3, 1000), d), layout=f"alpha={alpha}", kwargs=(("alpha", alpha),)),
        C(T((3, 1000), d), num, layout=f"scalar right, alpha={alpha}", kwargs=(("alpha", alpha),)),
        C(T((6, 40), d, "strided"), T((6, 40), d, "strided"), layout="x, y step-sliced"),
    ]
    if d.is_floating_point:
        cases.append(C(T((5, 33), d), T((5, 33), torch.int32), layout="y int32 (int+float)"))
    cases += [c for c in _number_pairs() if c.dtype == d]
    for n, size in SEEDS:
        cases.append(Case("add", (T((n, n), d), T((n, n), d)), "same shape", _bench(size)))
    for n, size in CUBES:
        cases.append(Case("add", (T((n, n, n), d), T((n,), d)), "y[N] (bias add)", _bench(size)))
    # host time per documented call form (1024 elements: bound by the host, not the device)
    cases += [Case("add", (T((1024,), d), T((1024,), d)), "form: add(x, y)", _bench("small")),
              Case("add", (T((1024,), d), T((1024,), d)), "form: add(x, y, alpha=2)", _bench("small"),
                   kwargs=(("alpha", 2),)),
              Case("add", (T((1024,), d), 2.0), "form: add(x, 2.0)", _bench("small"))]
    return cases


def _number_pairs() -> list[Case]:
    """``add`` of two Python numbers: a 0-d tensor of the default float dtype, or int64."""
    N = lambda x, y, layout, **kw: Case("add", (x, y), layout, Q, **kw)  # noqa: E731
    return [
        N(-8.47, -1.77, "two Python floats"),
        N(3, -1.77, "Python int + float"),
        N(-8.47, -1.77, "two Python floats, alpha=0.5", kwargs=(("alpha", 0.5),)),
        N(-8.47, -1.77, "two Python floats, out=", out="new"),
        N(3, -4, "two Python ints"),
        N(True, 5, "Python bool + int"),
        N(3, -4, "two Python ints, alpha=3", kwargs=(("alpha", 3),)),
        N(3, -4, "two Python ints, out=", out="new"),
    ]


def matmul_cases(d: torch.dtype) -> list[Case]:
    C = lambda a, b, layout, **kw: Case("matmul", (a, b), layout, Q, **kw)  # noqa: E731
    cases = [
        C(T((33, 17), d), T((17, 29), d), "2-D, odd sizes"),
        C(T((64, 64), d), T((64, 64), d), "2-D"),
        C(T((2, 4097), d), T((4097, 3), d), "2-D, K=4097"),
        C(T((17,), d), T((17,), d), "1-D @ 1-D"),
        C(T((17,), d), T((17, 9), d), "1-D @ 2-D"),
        C(T((9, 17), d), T((17,), d), "2-D @ 1-D"),
        C(T((3, 16, 17), d), T((3, 17, 8), d), "batched"),
        C(T((2, 1, 16, 17), d), T((3, 17, 8), d), "broadcast batch dims"),
        C(T((4, 16, 17), d), T((17, 8), d), "batched @ 2-D"),
        C(T((2, 2, 2, 8, 9), d), T((2, 1, 9, 5), d), "3 batch dims"),
        C(T((5, 0), d), T((0, 6), d), "K=0"),
        C(T((5, 5, 0), d), T((0, 5), d), "batched @ 2-D, K=0"),
        C(T((0, 8), d), T((8, 5), d), "M=0"),
        C(T((0, 4, 5), d), T((0, 5, 3), d), "batch=0"),
        C(T((33, 17), d, "transposed"), T((17, 29), d), "a transposed"),
        C(T((33, 17), d), T((17, 29), d, "transposed"), "b transposed"),
        C(T((33, 17), d, "transposed"), T((17, 29), d, "transposed"), "a, b transposed"),
        C(T((16, 40), d, "strided"), T((40, 8), d), "a step-sliced"),
        C(T((33, 17), d), T((17, 29), d), "out=", out="new"),
    ]
    for n, size in SEEDS:
        cases.append(Case("matmul", (T((n, n), d), T((n, n), d)), "square", _bench(size)))
    cases.append(Case("matmul", (T((16, 512, 512), d), T((16, 512, 512), d)), "batched", _bench("medium")))
    for (m, k, n), layout in (((16, 4096, 4096), "M=16"), ((64, 4096, 4096), "M=64"),
                              ((4096, 256, 4096), "K=256"), ((3000, 1000, 5000), "odd shape")):
        cases.append(Case("matmul", (T((m, k), d), T((k, n), d)), layout, _bench("medium")))
    return cases


def linear_cases(d: torch.dtype) -> list[Case]:
    C = lambda *a, layout, **kw: Case("linear", a, layout, Q, **kw)  # noqa: E731
    cases = [C(T((5, 17), d), T((9, 17), d), T((9,), d), layout="bias")]
    cases += [C(T((8, 32), d), T((16, 32), d), T((16,), d), act, layout=f"bias + {act}")
              for act in ("relu", "gelu", "gelu_tanh", "silu", "leaky_relu", "quick_gelu", "relu2")]
    cases += [
        C(T((8, 32), d), T((16, 32), d), T((16,), d), "leaky_relu", layout="leaky_relu slope 0.2",
          kwargs=(("negative_slope", 0.2),)),
        C(T((5, 17), d), T((9, 17), d), layout="no bias"),
        C(T((5, 17), d), T((9, 17), d), None, "gelu", layout="no bias + gelu"),
        C(T((2, 3, 17), d), T((9, 17), d), T((9,), d), layout="batched x"),
        C(T((17,), d), T((9, 17), d), T((9,), d), layout="1-D x"),
        C(T((5, 17), d), T((9, 17), d, "transposed"), T((9,), d), layout="weight transposed"),
        C(T((3, 1000), d), T((7, 1000), d), T((7,), d), "silu", layout="K=1000 + silu"),
        C(T((4, 0), d), T((3, 0), d), T((3,), d), layout="K=0"),
        C(T((2, 3, 0), d), T((4, 0), d), T((4,), d), "gelu", layout="batched x, K=0 + gelu"),
        C(T((5, 17), d), T((9, 17), d), T((9,), d), "relu", layout="out=", out="new"),
    ]
    cases += [C(x, w, *rest, layout=f"residual {what}", kwargs=(("residual", r),), out=out)
              for x, w, rest, r, what, out in _residual_layouts(d)]
    for n, size in SEEDS:
        cases.append(Case("linear", (T((n, n), d), T((n, n), d), T((n,), d), "gelu"), "bias + gelu",
                          _bench(size)))
    for name, k, n in RESIDUAL_LAYERS:  # a sublayer's closing projection with its residual add
        for m, size in GATED_TOKENS:
            cases.append(Case("linear", (T((m, k), d), T((n, k), d)), f"{name} {k}->{n}, no bias + residual",
                              _bench(size), kwargs=(("residual", T((m, n), d)),)))
    # host time per documented call form (a small layer: bound by the host, not the device)
    x, w, b = T((32, 512), d), T((512, 512), d), T((512,), d)
    cases += [Case("linear", (x, w, b, "gelu"), 'form: linear(x, w, b, "gelu")', _bench("small")),
              Case("linear", (x, w, b), 'form: linear(x, w, b, activation="gelu")', _bench("small"),
                   kwargs=(("activation", "gelu"),)),
              Case("linear", (x, w), "form: linear(x, w, bias=b)", _bench("small"), kwargs=(("bias", b),))]
    return cases


#: Llama-3-8B's sublayer-closing projections (config.json: hidden 4096, intermediate 14336, no
#: bias): ``residual + o_proj(attn)`` and ``residual + down_proj(mlp)``
RESIDUAL_LAYERS = (("llama3-8b o_proj", 4096, 4096), ("llama3-8b down_proj", 14336, 4096))


def _residual_layouts(d: torch.dtype) -> list[tuple[Any, ...]]:
    """(x, weight, (bias, activation), residual, label, out mode) of the tiny residual cases."""
    x, w, b = T((5, 17), d), T((9, 17), d), T((9,), d)
    xb = T((2, 3, 17), d)
    return [(x, w, (), T((5, 9), d), "(full)", None),
            (xb, w, (b, "gelu"), T((2, 3, 9), d), "after bias + gelu", None),
            (x, w, (b,), T((9,), d), "[N] broadcast", None),
            (x, w, (), T((1, 9), d), "(1, N)", None),
            (xb, w, (), T((2, 1, 9), d), "(B, 1, N) over a batch", None),
            (x, w, (None, "relu"), T((5, 9), d, "strided"), "step-sliced, after relu", None),
            (x, w, (b,), T((5, 9), d, "transposed"), "transposed", None),
            (x, w, (b,), T((5, 9), d), "(full), out=", "new"),
            (x, w, (), T((5, 9), d), "in place (out=residual)", "residual")]


# -- the real-model corpus (xkernels.harness.models) -------------------------------------------
def gemm_cases(op: str, dtype: torch.dtype) -> list:
    """``matmul`` / ``linear`` cases of the corpus in ``dtype``: every layer at every token count."""
    tags = frozenset({SIZE_TAG})
    out = []
    for key, labels, models in gemm_layers(op):
        k, n = key[0], key[1]
        for m in corpus()["tokens"]:
            if op == "linear":
                act, bias = key[2], key[3]
                args: tuple[Any, ...] = (T((m, k), dtype), T((n, k), dtype), T((n,), dtype) if bias else None)
                if act:
                    args += (act,)
                layout = ", ".join(labels) + (f" + {act}" if act else "") + ("" if bias else ", no bias")
            else:
                args, layout = (T((m, k), dtype), T((k, n), dtype)), ", ".join(labels)
            out.append(Case(op, args, layout, tags, models=tuple(models)))
    return out


def elementwise_cases(op: str, dtype: torch.dtype) -> list:
    """``add`` / ``broadcast`` cases of the corpus in ``dtype``."""
    tags = frozenset({SIZE_TAG})
    return [Case(op, (T(tuple(e["x"]), dtype), T(tuple(e["y"]), dtype)), f"{e['model']}: {e['what']}", tags,
                 models=(e["model"],))
            for e in corpus()["elementwise"] if op in e["ops"]]


def model_cases(op: str, dtype: torch.dtype) -> list:
    """The corpus cases of ``op`` in ``dtype`` (floating dtypes only: models run in fp16/bf16/fp32)."""
    if not dtype.is_floating_point:
        return []
    return gemm_cases(op, dtype) if op in ("matmul", "linear") else elementwise_cases(op, dtype)


#: gated MLP layers (hidden H -> intermediate I, activation, weight form), from each model's
#: Hugging Face config.json (hidden_size, intermediate_size, hidden_act): Llama-3-8B and
#: Mistral-7B 4096 -> 14336 silu; Qwen2-7B 3584 -> 18944 silu; Gemma-7B 3072 -> 24576 and
#: Gemma-2B 2048 -> 16384 gelu_pytorch_tanh; Phi-3-mini 3072 -> 8192 silu with the concatenated
#: (2 * 8192, 3072) gate_up_proj. No biases (none of these models has one).
GATED_LAYERS = (("llama3-8b, mistral-7b", 4096, 14336, "silu", False), ("qwen2-7b", 3584, 18944, "silu", False),
                ("gemma-7b", 3072, 24576, "gelu_tanh", False), ("gemma-2b", 2048, 16384, "gelu_tanh", False),
                ("phi3-mini", 3072, 8192, "silu", True))
GATED_TOKENS = ((16, "small"), (512, "medium"), (2048, "large"))


def gated_linear_cases(d: torch.dtype) -> list[Case]:
    C = lambda *a, layout, **kw: Case("gated_linear", a, layout, Q, **kw)  # noqa: E731
    cases = [C(T((5, 24), d), T((9, 24), d), T((9, 24), d), layout="separate, no bias")]
    cases += [C(T((8, 32), d), T((16, 32), d), T((16, 32), d), T((16,), d), T((16,), d), act,
                layout=f"separate, biases + {act}") for act in GATED_ACTIVATIONS]
    cases += [
        C(T((5, 24), d), T((18, 24), d), layout="concatenated gate_up (Phi-3)"),
        C(T((5, 24), d), T((18, 24), d), None, T((18,), d), None, "gelu", layout="concatenated, bias + gelu"),
        C(T((2, 3, 17), d), T((7, 17), d), T((7, 17), d), layout="batched x, odd sizes"),
        C(T((17,), d), T((7, 17), d), T((7, 17), d), layout="1-D x"),
        C(T((9, 17), d, "transposed"), T((7, 17), d), T((7, 17), d), layout="x transposed"),
        C(T((3, 1000), d), T((14, 1000), d), layout="concatenated, K=1000"),
        C(T((4, 0), d), T((3, 0), d), T((3, 0), d), T((3,), d), T((3,), d), layout="K=0"),
    ]
    for n, size in SEEDS:
        cases.append(Case("gated_linear", (T((n, n), d), T((n, n), d), T((n, n), d)), "silu", _bench(size)))
    for name, h, i, act, concat in GATED_LAYERS:
        for m, size in GATED_TOKENS:
            w = (T((2 * i, h), d),) if concat else (T((i, h), d), T((i, h), d))
            args = (T((m, h), d), *w)
            if act != "silu":
                args += (None,) * (5 - len(args)) + (act,)
            cases.append(Case("gated_linear", args, f"{name} {h}->{i} {act}" + (" (gate_up)" if concat else ""),
                              _bench(size)))
    return cases


#: (rows, N, label, bench size) of the model-sized norm cases: BERT-base 16 x 512 tokens, Llama-3-8B
#: and Llama-2-13B (N = 5120) 8 x 1024 tokens, an odd N = 1000
NORM_SHAPES = ((8192, 768, "BERT-base hidden 768", "medium"), (8192, 4096, "Llama-3-8B hidden 4096", "large"),
               (8192, 5120, "Llama-2-13B hidden 5120", "large"), (4096, 1000, "odd N=1000", "medium"),
               (16, 4096, "decode: 16 tokens, hidden 4096", "small"))


def norm_cases(op: str, d: torch.dtype) -> list[Case]:
    """``add_layer_norm`` / ``add_rms_norm``: with and without residual, weight, bias, the sum;
    odd N, broadcast residual, non-contiguous x, promotion."""
    layer = op == "add_layer_norm"
    C = lambda *a, layout, **kw: Case(op, a, layout, Q, **kw)  # noqa: E731

    def full(rows: int, n: int, x: str = "contiguous", r: tuple[int, ...] | None = None) -> tuple[Any, ...]:
        wb = (T((n,), d), T((n,), d)) if layer else (T((n,), d),)
        return (T((rows, n), d, x), T(r or (rows, n), d), *wb)

    cases = [C(*full(rows, n), layout=f"x + residual, weight{', bias' if layer else ''}, N={n}")
             for rows, n in ((5, 7), (4, 768), (3, 1000), (2, 4096), (2, 5120))]
    cases += [
        C(T((6, 40), d), None, layout="no residual (s = x)"),
        C(T((6, 40), d), T((6, 40), d), layout="no weight" + (", no bias" if layer else "")),
        C(*full(6, 40), layout="return_sum=False", kwargs=(("return_sum", False),)),
        C(*full(6, 40, r=(40,)), layout="residual[N] broadcast"),
        C(*full(17, 33, x="transposed"), layout="x transposed (copied)"),
        C(*full(6, 40, x="strided"), layout="x step-sliced [..., ::2] (copied)"),
        C(T((5, 33), d), T((5, 33), _other_float(d)), layout=f"residual {str(_other_float(d))[6:]} (promotes)"),
    ]
    if not layer:
        cases.append(C(T((6, 40), d), T((6, 40), d), T((40,), d), layout="offset=1.0 (Gemma's 1 + weight)",
                       kwargs=(("offset", 1.0),)))
    for n, size in SEEDS:
        cases.append(Case(op, full(n, n), "x + residual, weight" + (", bias" if layer else ""), _bench(size)))
    for rows, n, label, size in NORM_SHAPES:
        cases.append(Case(op, full(rows, n), label, _bench(size)))
        # forward + backward against torch's (y.backward(dy) with the sum's gradient too): the
        # fused backward kernel against aten's LayerNorm backward and autograd's accumulation
        cases.append(Case(op, full(rows, n), f"{label}, forward+backward", _bench(size), backward=True))
    return cases


#: rotary embedding layers: (label, batch, tokens, q heads, kv heads, head dim, rotary dim, rope base,
#: rows of cos / sin (1: one table for the batch, b: one per sequence), bench size), from each model's
#: Hugging Face config.json: Llama-3-8B 32 q / 8 kv heads of 128, rope_theta 500000, full rotary;
#: Pythia-1.4B (GPT-NeoX) 16 heads of 128, rotary_pct 0.25 (32), rotary_emb_base 10000; Phi-2 32
#: heads of 80, partial_rotary_factor 0.4 (32), rope_theta 10000; GLM-4-9B 32 q / 2 kv heads of 128,
#: partial_rotary_factor 0.5 (64), adjacent pairs (``interleaved=True``; a label naming "adjacent
#: pairs" takes it). q and k as transformers lays
#: them out: ``(b, s, h*d)`` projections viewed ``(b, s, h, d)`` and transposed to ``(b, h, s, d)``;
#: cos / sin ``(1 or b, s, r)`` of real angles at real positions (``case.rotary_positions``).
ROTARY_LAYERS = (("Llama-3-8B prefill 1x2048", 1, 2048, 32, 8, 128, 128, 500000.0, 1, "medium"),
                 ("Llama-3-8B batch 16x512, positions per sequence", 16, 512, 32, 8, 128, 128, 500000.0, 16, "medium"),
                 ("Llama-3-8B decode 64x1", 64, 1, 32, 8, 128, 128, 500000.0, 64, "small"),
                 ("Pythia-1.4B (GPT-NeoX) 4x512, rotary 32 of 128", 4, 512, 16, 16, 128, 32, 10000.0, 1, "medium"),
                 ("Phi-2 4x512, head 80, rotary 32", 4, 512, 32, 32, 80, 32, 10000.0, 1, "medium"),
                 ("GLM-4-9B prefill 1x2048, adjacent pairs, rotary 64 of 128", 1, 2048, 32, 2, 128, 64, 10000.0, 1,
                  "medium"))


def rotary_args(d: torch.dtype, b: int, s: int, hq: int, hkv: int, hd: int, r: int, theta: float = 10000.0,
                cos_rows: int = 1, view: str = "heads", pairs: bool = False) -> tuple[T, T, T, T]:
    """q ``(b, hq, s, hd)``, k ``(b, hkv, s, hd)`` (``view``: ``heads``, transformers' transposed
    projections, or ``contiguous``) and the cos / sin tables ``(cos_rows, s, r)`` (``pairs``: laid
    out for ``interleaved=True``)."""
    table = " pairs" if pairs else ""
    return (T((b, hq, s, hd), d, view), T((b, hkv, s, hd), d, view),
            T((cos_rows, s, r), d, "cos" + table, theta), T((cos_rows, s, r), d, "sin" + table, theta))


def rotary_cases(d: torch.dtype) -> list[Case]:
    """``rotary_embedding``: full and partial rotary, GQA, one table for the batch or one per
    sequence, decode, odd head dims, other layouts; the model layers of :data:`ROTARY_LAYERS`,
    forward and forward+backward (decode: forward only, it is inference)."""
    C = lambda *a, layout, **kw: Case("rotary_embedding", a, layout, Q, **kw)  # noqa: E731
    R = lambda *a, **kw: rotary_args(d, *a, **kw)  # noqa: E731
    o = _other_float(d)
    cases = [
        C(*R(2, 7, 4, 2, 16, 16), layout="GQA 4/2 heads, head 16, full rotary"),
        C(*R(1, 16, 8, 2, 128, 128, 500000.0), layout="head 128, rope_theta 500000 (Llama-3)"),
        C(*R(3, 5, 4, 4, 32, 32, cos_rows=3), layout="cos / sin per sequence (b, s, r)"),
        C(*R(4, 1, 4, 2, 64, 64, cos_rows=4), layout="decode: 1 token per sequence"),
        C(*R(2, 9, 4, 4, 32, 8), layout="partial rotary 8 of 32 (GPT-NeoX)"),
        C(*R(2, 9, 4, 4, 20, 8), layout="partial rotary 8 of 20, head 20 (Phi-2)"),
        C(*R(2, 6, 3, 1, 16, 16, view="contiguous"), layout="q, k contiguous (b, h, s, d), MQA"),
        C(T((2, 6, 4, 16), d), T((2, 6, 2, 16), d), T((1, 6, 16), d, "cos"), T((1, 6, 16), d, "sin"),
          layout="unsqueeze_dim=2: q, k (b, s, h, d)", kwargs=(("unsqueeze_dim", 2),)),
        C(T((2, 4, 7, 16), d, "strided"), *R(2, 7, 2, 2, 16, 16)[1:], layout="q step-sliced [..., ::2] (copied)"),
        C(*R(2, 0, 4, 2, 16, 16), layout="empty: 0 tokens"),
        C(*R(2, 5, 4, 2, 16, 16)[:2], T((1, 5, 16), o, "cos"), T((1, 5, 16), o, "sin"),
          layout=f"cos / sin {str(o)[6:]} (promotes)"),
        C(*R(2, 7, 4, 2, 16, 16, pairs=True), layout="adjacent pairs (Cohere), GQA 4/2 heads",
          kwargs=(("interleaved", True),)),
        C(*R(3, 5, 4, 1, 32, 16, cos_rows=3, pairs=True), layout="adjacent pairs, partial rotary 16 of 32 (GLM)",
          kwargs=(("interleaved", True),)),
    ]
    for label, b, s, hq, hkv, hd, r, theta, rows, size in ROTARY_LAYERS:
        pairs = "adjacent pairs" in label
        args = R(b, s, hq, hkv, hd, r, theta, cos_rows=rows, pairs=pairs)
        kw = (("interleaved", True),) if pairs else ()
        cases.append(Case("rotary_embedding", args, label, _bench(size), kwargs=kw))
        if s > 1:  # training: q and k's gradients through the backward's transposed rotation
            cases.append(Case("rotary_embedding", args, f"{label}, forward+backward", _bench(size), backward=True,
                              kwargs=kw))
    return cases


_BUILDERS: dict[str, Callable[[torch.dtype], list[Case]]] = {
    "broadcast": broadcast_cases, "add": add_cases, "matmul": matmul_cases, "linear": linear_cases,
    "gated_linear": gated_linear_cases,
    "add_layer_norm": lambda d: norm_cases("add_layer_norm", d), "add_rms_norm": lambda d: norm_cases("add_rms_norm", d),
    "rotary_embedding": rotary_cases}


def dtypes_for(op: str) -> tuple[torch.dtype, ...]:
    """The dtypes an op is checked in: floats everywhere, ints for the element-wise ops."""
    return FLOAT_DTYPES if OPS[op].matmul_like or OPS[op].floats_only else FLOAT_DTYPES + INT_DTYPES


def cases(ops: Iterable[str] = OP_NAMES, dtypes: Iterable[torch.dtype] | None = None,
          sizes: Iterable[str] = ("quick",), models: Iterable[str] | None = None) -> list[Case]:
    """Cases of ``ops`` × ``dtypes`` (default: each op's own) carrying any of the ``sizes`` tags;
    ``models``: only corpus cases of these models (``harness.models.model_names()``)."""
    want = set(sizes)
    unknown = want - set(SIZES)
    if unknown:
        raise ValueError(f"unknown size tag(s) {sorted(unknown)}; known: {', '.join(SIZES)}")
    wanted_models = None if models is None else set(models)
    if wanted_models is not None and wanted_models - set(model_names()):
        raise ValueError(f"unknown model(s) {sorted(wanted_models - set(model_names()))}; "
                         f"known: {', '.join(model_names())}")
    picked: list[Case] = []
    for op in ops:
        if op not in _BUILDERS:
            raise ValueError(f"unknown op {op!r}; known: {', '.join(OP_NAMES)}")
        for d in dtypes_for(op) if dtypes is None else [d for d in dtypes if d in dtypes_for(op)]:
            built = (_BUILDERS[op](d) + (model_cases(op, d) if SIZE_TAG in want else [])
                     + (heldout_cases(op, d, Case, T) if HELDOUT in want else []))
            picked += [c for c in built if c.sizes & want
                       and (wanted_models is None or wanted_models & set(c.models))]
    return picked


DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
                 "float": "float32", "i32": "int32", "i64": "int64", "int": "int64"}


def parse_dtype(name: str) -> torch.dtype:
    """``"fp16"`` / ``"float16"`` → ``torch.float16`` (ValueError naming the known ones)."""
    key = DTYPE_ALIASES.get(name.strip().lower(), name.strip().lower())
    dt = getattr(torch, key, None)
    if not isinstance(dt, torch.dtype) or dt not in FLOAT_DTYPES + INT_DTYPES:
        known = ", ".join(str(d).removeprefix("torch.") for d in FLOAT_DTYPES + INT_DTYPES)
        raise ValueError(f"unknown dtype {name!r}; known: {known} (or fp16, bf16, fp32)")
    return dt
