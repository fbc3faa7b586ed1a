"""The case lists cover what users meet, keep quick small, and build the layouts they name."""

from __future__ import annotations

import math

import pytest
import torch

from xkernels.harness.cases import INT_RANGE, OP_NAMES, cases, expected_result, parse_dtype

QUICK_MAX_ELEMENTS = 1 << 18  # per operand: the quick suite runs under the interpreter on 2 cores


def layouts(op: str, dtype: torch.dtype, sizes=("quick",)) -> set[str]:
    return {c.layout for c in cases([op], [dtype], sizes)}


@pytest.mark.parametrize("op, needles", [
    ("broadcast", ["bias[N]", "per-channel (C,1,1) over NCHW", "mask [B,1,1,S] over [B,H,S,S]", "(1,D)",
                   "single element", "0-d bias", "0-d", "empty", "transposed", "step-sliced", "expanded (stride 0)",
                   "out=", "in place (out=x)", "promotes"]),
    ("add", ["Python scalar right", "Python scalar left", "alpha=", "broadcast both sides", "transposed",
             "step-sliced", "expanded (stride 0)", "empty", "0-d", "out=", "in place", "int+float", "promotes"]),
    ("matmul", ["1-D @ 1-D", "1-D @ 2-D", "2-D @ 1-D", "batched", "broadcast batch dims", "K=0", "a transposed",
                "b transposed", "out=", "batched @ 2-D, K=0", "M=0", "batch=0"]),
    ("linear", ["bias + relu", "bias + gelu", "bias + gelu_tanh", "bias + silu", "bias + leaky_relu", "no bias",
                "1-D x", "weight transposed", "out=", "K=0", "batched x, K=0"]),
    ("rotary_embedding", ["GQA", "full rotary", "rope_theta 500000", "per sequence (b, s, r)", "decode",
                          "partial rotary 8 of 32", "head 20", "contiguous (b, h, s, d)", "unsqueeze_dim=2",
                          "step-sliced", "empty", "promotes"]),
])
def test_quick_layouts(op, needles):
    have = layouts(op, torch.float16)
    for needle in needles:
        assert any(needle in label for label in have), (needle, sorted(have))


def test_odd_trailing_sizes_and_int_dtypes():
    labels = layouts("broadcast", torch.int32)
    for n in (7, 1000, 4097, 65539):
        assert f"bias[N], N={n}" in labels
    assert {c.dtype for c in cases(["add"], None, ["quick"])} == {torch.float16, torch.bfloat16, torch.float32,
                                                                   torch.int32, torch.int64}
    assert {c.dtype for c in cases(["matmul"], None, ["quick"])} == {torch.float16, torch.bfloat16, torch.float32}


def test_quick_is_small_and_big_sizes_are_full_and_bench():
    for c in cases(OP_NAMES, None, ["quick"]):
        for s in c.shapes:
            if isinstance(s, tuple):
                assert math.prod(s) <= QUICK_MAX_ELEMENTS, c.id
    full = {(c.op, c.shapes[0]) for c in cases(OP_NAMES, [torch.float32], ["full"])}
    for n in (256, 1024, 2048, 4096, 8192):
        for op in OP_NAMES:
            if op != "rotary_embedding":  # 4-D q / k of model layers, no square seed sizes
                assert (op, (n, n)) in full
    assert ("broadcast", (512, 512, 512)) in full and ("add", (1024, 1024, 1024)) in full
    bench = cases(OP_NAMES, [torch.float32], ["small", "medium", "large"])
    assert bench and all("full" in c.sizes and not c.sizes & {"quick"} for c in bench)
    assert {s for c in bench for s in c.sizes} >= {"small", "medium", "large"}


def test_make_inputs_layouts_and_values():
    by_layout = {c.layout: c for c in cases(["broadcast"], [torch.float32], ["quick"])}
    x, b = by_layout["x transposed"].make_inputs("cpu", 1).args
    assert not x.is_contiguous() and x.stride() == (1, 17)
    x, b = by_layout["x step-sliced [..., ::2]"].make_inputs("cpu", 1).args
    assert x.stride()[-1] == 2
    x, b = by_layout["bias expanded (stride 0)"].make_inputs("cpu", 1).args
    assert b.stride()[0] == 0 and b.shape == x.shape
    inp = by_layout["in place (out=x)"].make_inputs("cpu", 1)
    assert inp.out is inp.args[0]
    inp = by_layout["out="].make_inputs("cpu", 1)
    assert inp.out.shape == inp.args[0].shape and inp.out is not inp.args[0]
    first, again, other = (by_layout["bias[N], N=1000"].make_inputs("cpu", s).args[0] for s in (5, 5, 6))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert (first != 0).float().mean() > 0.99
    ints = cases(["add"], [torch.int64], ["quick"])[0].make_inputs("cpu", 3).args[0]
    assert INT_RANGE[0] <= int(ints.min()) and int(ints.max()) < INT_RANGE[1] and ints.abs().sum() > 0


def test_expected_result_follows_torch_promotion():
    by_layout = {c.layout: c for c in cases(["add"], [torch.float16], ["quick"])}
    assert expected_result("add", by_layout["y float32 (promotes)"].make_inputs("cpu", 0)).dtype == torch.float32
    assert expected_result("add", by_layout["y int32 (int+float)"].make_inputs("cpu", 0)).dtype == torch.float16
    assert expected_result("add", by_layout["Python scalar left"].make_inputs("cpu", 0)).dtype == torch.float16


def test_parse_dtype():
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("float32") is torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("float8")


@pytest.mark.uses_interpreter
def test_add_of_two_python_numbers_is_checked_like_torch():
    """add's Python-number pairs: in the quick list under PyTorch's result dtype, and the check
    passes them on the cpu and interpreter backends (a 0-d CPU result, or out=)."""
    from xkernels.harness import accuracy, resolve_target

    pairs = [c for c in cases(["add"], None, ["quick"]) if not any(isinstance(s, tuple) for s in c.shapes)]
    assert {c.dtype for c in pairs} == {torch.float32, torch.int64}
    labels = {c.layout for c in pairs}
    assert {"two Python floats", "two Python ints", "Python int + float", "Python bool + int",
            "two Python floats, out=", "two Python ints, alpha=3"} <= labels
    for c in pairs:
        assert expected_result("add", c.make_inputs("cpu", 1)).shape == ()
    for name in ("cpu", "interpreter"):
        target = resolve_target(backend=name)
        for c in pairs:
            res = accuracy.check_case(c, target.backend, target.device, seed=4)
            assert res.passed, (name, c.id, res.message)


def test_gated_linear_cases_and_reference():
    """Quick cases cover both weight forms and every activation; bench cases carry the model
    layers (Llama-3-8B/Mistral 4096 -> 14336, Qwen2, Gemma, Phi-3's concatenated gate_up); the
    reference is ``F.silu(F.linear(x, wg, bg)) * F.linear(x, wu, bu)``."""
    from xkernels.harness.cases import OPS

    quick = cases(["gated_linear"], [torch.float32], ["quick"])
    assert {c.layout for c in quick} >= {"concatenated gate_up (Phi-3)", "separate, biases + gelu_tanh"}
    bench = {c.layout: c.shapes for c in cases(["gated_linear"], [torch.bfloat16], ["medium"])}
    assert bench["llama3-8b, mistral-7b 4096->14336 silu"][:3] == ((512, 4096), (14336, 4096), (14336, 4096))
    assert bench["phi3-mini 3072->8192 silu (gate_up)"] == ((512, 3072), (16384, 3072))
    assert any(k.startswith("qwen2-7b") for k in bench) and any(k.startswith("gemma-7b") for k in bench)
    F = torch.nn.functional
    x, wg, wu, bg, bu = (torch.randn(s, dtype=torch.float64) for s in ((3, 8), (5, 8), (5, 8), (5,), (5,)))
    want = F.silu(F.linear(x, wg, bg)) * F.linear(x, wu, bu)
    torch.testing.assert_close(OPS["gated_linear"].torch_fn(x, wg, wu, bg, bu), want)
    torch.testing.assert_close(OPS["gated_linear"].torch_fn(x, torch.cat([wg, wu]), None, torch.cat([bg, bu])), want)


def test_rotary_cases_are_transformers_layouts_with_real_angles():
    """rotary_embedding's cases: float dtypes only; q / k as transformers lays them out ((b, s, h*d)
    projections viewed and transposed); cos / sin the cos and sin of real rotary angles (inv_freq
    = 1 / theta ** (2i / r) at integer positions, the two halves equal), not random; the model
    layers (Llama-3-8B prefill, batch, decode; Pythia's and Phi-2's partial rotary) in the bench
    sizes, forward+backward rows for the training shapes."""
    from xkernels.harness.case import rotary_positions
    from xkernels.harness.cases import OPS

    assert {c.dtype for c in cases(["rotary_embedding"], None, ["full"])} == {torch.float16, torch.bfloat16,
                                                                               torch.float32}
    by_layout = {c.layout: c for c in cases(["rotary_embedding"], [torch.float32], ["full"])}
    prefill = by_layout["Llama-3-8B prefill 1x2048"]
    assert prefill.shapes == ((1, 32, 2048, 128), (1, 8, 2048, 128), (1, 2048, 128), (1, 2048, 128))
    assert prefill.sizes == {"full", "medium"} and "Llama-3-8B prefill 1x2048, forward+backward" in by_layout
    assert by_layout["Llama-3-8B prefill 1x2048, forward+backward"].backward
    assert by_layout["Llama-3-8B batch 16x512, positions per sequence"].shapes[::2] == ((16, 32, 512, 128),
                                                                                         (16, 512, 128))
    decode = by_layout["Llama-3-8B decode 64x1"]
    assert decode.shapes[::2] == ((64, 32, 1, 128), (64, 1, 128)) and "small" in decode.sizes
    assert not any(c.backward and "decode" in c.layout for c in by_layout.values())
    pythia = next(c for label, c in by_layout.items() if label.startswith("Pythia"))
    phi = next(c for label, c in by_layout.items() if label.startswith("Phi-2"))
    assert pythia.shapes[0][1:2] + pythia.shapes[0][3:] == (16, 128) and pythia.shapes[2][-1] == 32
    assert phi.shapes[0][1:2] + phi.shapes[0][3:] == (32, 80) and phi.shapes[2][-1] == 32

    q, k, cos, sin = by_layout["cos / sin per sequence (b, s, r)"].make_inputs("cpu", 1).args
    b, h, s, d = q.shape
    assert q.stride() == (s * h * d, d, h * d, 1)  # (b, s, h*d) viewed (b, s, h, d), transposed
    assert k.stride() == (s * k.shape[1] * d, d, k.shape[1] * d, 1)
    torch.testing.assert_close(cos.square() + sin.square(), torch.ones_like(cos))
    assert torch.equal(cos[..., :d // 2], cos[..., d // 2:]) and torch.equal(sin[..., :d // 2], sin[..., d // 2:])
    angles = torch.atan2(sin, cos).double()
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d, 2).double() / d)
    want = rotary_positions(b, s).double()[..., None] * inv_freq
    torch.testing.assert_close(torch.remainder(angles[..., :d // 2] - want + math.pi, 2 * math.pi) - math.pi,
                               torch.zeros_like(want), atol=1e-4, rtol=0)
    positions = rotary_positions(4, 1)
    assert positions.shape == (4, 1) and len(set(positions.flatten().tolist())) == 4  # decode: each its own length
    assert torch.equal(rotary_positions(1, 5), torch.arange(5)[None])  # a prefill from position 0
    again = by_layout["cos / sin per sequence (b, s, r)"].make_inputs("cpu", 2).args
    assert torch.equal(again[2], cos) and not torch.equal(again[0], q)  # the tables are fixed, q / k random

    # the reference: transformers' apply_rotary_pos_emb (rotate_half), partial rotary passing the rest on
    q, k = torch.randn(2, 4, 3, 10, dtype=torch.float64), torch.randn(2, 2, 3, 10, dtype=torch.float64)
    cos, sin = torch.randn(1, 3, 6, dtype=torch.float64), torch.randn(1, 3, 6, dtype=torch.float64)

    def rotate_half(x):
        return torch.cat((-x[..., 3:], x[..., :3]), dim=-1)

    c, sn = cos.unsqueeze(1), sin.unsqueeze(1)
    for got, x in zip(OPS["rotary_embedding"].torch_fn(q, k, cos, sin), (q, k)):
        head = x[..., :6]
        torch.testing.assert_close(got, torch.cat((head * c + rotate_half(head) * sn, x[..., 6:]), dim=-1))
    refs, mags, terms = OPS["rotary_embedding"].reference(torch.float32, q, k, cos, sin)
    assert terms == 2 and len(refs) == len(mags) == 2
    assert torch.equal(mags[0][..., 6:], torch.zeros_like(q[..., 6:]))  # the columns passed on are exact
    torch.testing.assert_close(mags[1][..., :6], k[..., :6].abs() * c.abs() + rotate_half(k[..., :6]).abs() * sn.abs())
