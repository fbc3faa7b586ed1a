"""matmul(a, b) with torch.matmul semantics, and linear(...) with its fused epilogue."""

from __future__ import annotations

import itertools

import pytest
import torch

from helpers import Unchanged, assert_close, dot_scale, every_matmul_to_vendor, planted_tables, poisoned, rand
from xkernels import tuning
from xkernels.backends.interpreter import InterpreterBackend
from xkernels.ops import linear, matmul
from xkernels.ops.matmul import ACTIVATIONS, reference_linear

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
SHAPES = [
    ((33, 70), (70, 45)),
    ((64, 64), (64, 64)),
    ((70,), (70, 45)),              # 1-D @ 2-D
    ((33, 70), (70,)),              # 2-D @ 1-D
    ((70,), (70,)),                 # dot -> 0-d
    ((2, 3, 17, 40), (40, 9)),      # batched @ 2-D (batch folds into M)
    ((2, 1, 17, 40), (3, 40, 9)),   # broadcast batch dims
    ((4, 2, 3, 5, 8), (8, 6)),
    ((2, 2, 2, 5, 8), (2, 1, 2, 8, 6)),  # three batch dims
    ((16, 0), (0, 8)),              # K = 0 -> zeros
    ((0, 8), (8, 5)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sa,sb", SHAPES, ids=str)
def test_shapes(backend, device, dtype, sa, sb):
    a, b = rand(sa, dtype, device), rand(sb, dtype, device)
    with Unchanged(a, b):
        got = matmul(a, b)
    ref = torch.matmul(a.double().cpu(), b.double().cpu())
    assert_close(got, ref, dtype, scale=dot_scale(sa[-1]))


def _empty_dim_cases():
    """Every operand kind (1-D, 2-D, batched, broadcast batch) with K, M, N or batch = 0."""
    for K, M, N, B in itertools.product((0, 3), (0, 2), (0, 4), (0, 2)):
        if 0 not in (K, M, N, B):
            continue
        for sa in ((K,), (M, K), (B, M, K), (2, B, M, K), (B, 1, M, K)):
            for sb in ((K,), (K, N), (B, K, N), (1, K, N), (2, 1, K, N)):
                yield sa, sb


def test_empty_dims_match_torch(backend, device):
    """K = 0 gives zeros, M/N/batch = 0 give empty results, as torch.matmul (also with a batch
    folded into M, and with out=); linear likewise for x of any rank."""
    n = 0
    for sa, sb in dict.fromkeys(_empty_dim_cases()):
        a, b = rand(sa, torch.float32, device), rand(sb, torch.float32, device)
        try:
            want = torch.matmul(a.double().cpu(), b.double().cpu())
        except RuntimeError:  # shapes torch rejects (batch dims 0 vs 2): ours must reject them too
            with pytest.raises(ValueError, match="do not broadcast"):
                matmul(a, b)
            continue
        with Unchanged(a, b):
            got = matmul(a, b)
            out = poisoned(want.shape, torch.float32, device)
            assert matmul(a, b, out=out) is out
        assert_close(got, want, torch.float32)
        assert_close(out, want, torch.float32)
        n += 1
    assert n > 150
    for K, M, N in itertools.product((0, 3), (0, 2), (0, 4)):
        for sx in ((K,), (M, K), (2, M, K), (0, M, K), (2, 3, M, K)):
            x, w = rand(sx, torch.float32, device), rand((N, K), torch.float32, device)
            bias = rand((N,), torch.float32, device)
            want = torch.nn.functional.linear(x.double().cpu(), w.double().cpu(), bias.double().cpu())
            with Unchanged(x, w, bias):
                assert_close(linear(x, w, bias, "gelu"), torch.nn.functional.gelu(want), torch.float32)
                assert_close(linear(x, w), torch.nn.functional.linear(x.double().cpu(), w.double().cpu()), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_layouts_and_out(backend, device, dtype):
    at = rand((40, 33), dtype, device).t()        # transposed operand
    bs = rand((80, 90), dtype, device)[::2, ::2]  # step-sliced operand (40, 45)
    ref = at.double().cpu() @ bs.double().cpu()
    assert_close(matmul(at, bs), ref, dtype, scale=dot_scale(40))
    out = poisoned((33, 45), dtype, device)
    assert matmul(at, bs, out=out) is out
    assert_close(out, ref, dtype, scale=dot_scale(40))
    out_t = poisoned((45, 33), dtype, device).t()
    matmul(at, bs, out=out_t)
    assert_close(out_t, ref, dtype, scale=dot_scale(40))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", list(ACTIVATIONS), ids=str)
def test_linear(backend, device, dtype, activation):
    x, w, b = rand((3, 5, 48), dtype, device), rand((40, 48), dtype, device), rand((40,), dtype, device)
    with Unchanged(x, w, b):
        got = linear(x, w, b, activation)
    ref = reference_linear(x.double().cpu(), w.double().cpu(), b.double().cpu(), activation)
    assert_close(got, ref, dtype, scale=dot_scale(48))
    got = linear(x, w, None, activation, negative_slope=0.2)
    ref = reference_linear(x.double().cpu(), w.double().cpu(), None, activation, 0.2)
    assert_close(got, ref, dtype, scale=dot_scale(48))


def test_fallback_dtypes(backend, device):
    a, b = torch.randn(5, 7, dtype=torch.float64, device=device), torch.randn(7, 3, dtype=torch.float64, device=device)
    torch.testing.assert_close(matmul(a, b), a @ b)


def test_bad_input(backend, device):
    a, b = rand((4, 6), torch.float32, device), rand((6, 5), torch.float32, device)
    out = poisoned((4, 5), torch.float32, device)
    with pytest.raises(ValueError, match=r"inner dimensions differ: 'a' \(4, 6\) @ 'b' \(5, 6\)"):
        matmul(a, rand((5, 6), torch.float32, device), out=out)
    with pytest.raises(TypeError, match="'a' and 'b' must have one dtype, got torch.float32 and torch.float16"):
        matmul(a, b.half(), out=out)
    with pytest.raises(TypeError, match="dtype torch.int32 is not supported"):
        matmul(a.int(), b.int())
    with pytest.raises(ValueError, match="must have at least 1 dimension"):
        matmul(torch.tensor(1.0, device=device), b)
    with pytest.raises(TypeError, match="argument 'b' must be a torch.Tensor"):
        matmul(a, 3.0)
    with pytest.raises(ValueError, match=r"shapes do not broadcast: 'a batch' \(2,\), 'b batch' \(3,\)"):
        matmul(rand((2, 4, 6), torch.float32, device), rand((3, 6, 5), torch.float32, device))
    with pytest.raises(ValueError, match="'activation' must be one of"):
        linear(a, rand((5, 6), torch.float32, device), None, "tanh")
    with pytest.raises(ValueError, match=r"'bias' must have shape \(5,\)"):
        linear(a, rand((5, 6), torch.float32, device), rand((6,), torch.float32, device))
    with pytest.raises(TypeError, match=r"'out' has dtype torch.float16"):
        matmul(a, b, out=poisoned((4, 5), torch.float16, device))
    assert torch.isnan(out).all()


@pytest.mark.parametrize("transposed", [False, True], ids=["row-major", "transposed"])
def test_misaligned_leading_stride_is_realigned(backend, device, transposed):
    """K = 257 and N = 300 leave rows misaligned for the matrix unit; the kernel path copies the
    operands to an aligned leading stride first (explain() says so) and the result is unchanged."""
    a = rand((257, 300), torch.float16, device).t() if transposed else rand((300, 257), torch.float16, device)
    b = rand((257, 300), torch.float16, device)
    with Unchanged(a, b):
        got = matmul(a, b)
    assert_close(got, a.double().cpu() @ b.double().cpu(), torch.float16, scale=dot_scale(257))
    exp = matmul.explain(a, b)
    if backend.runs_triton and backend.misaligned_to_vendor:  # cuda: the device's BLAS reads them in place
        assert exp.route == "vendor BLAS" and "misaligned" in exp.why, exp
    elif backend.runs_triton:
        assert "realign_a" in exp.config and "realign_b" in exp.config, exp
    if backend.runs_triton:  # a forced kernel config (a sweep) always takes the copy
        with tuning.force({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}):
            exp = matmul.explain(a, b)
            assert "realign_a" in exp.config and "realign_b" in exp.config, exp
            assert_close(matmul(a, b), a.double().cpu() @ b.double().cpu(), torch.float16, scale=dot_scale(257))


def test_misaligned_operands_go_to_the_vendor_blas_where_the_backend_says(backend, device, monkeypatch):
    """A backend with ``misaligned_to_vendor`` (cuda) runs the PyTorch call for a misaligned
    operand, epilogue included; the result, ``out=`` and gradients are torch's."""
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch for every call")
    monkeypatch.setattr(backend, "misaligned_to_vendor", True)
    x, w = rand((300, 263), torch.float32, device), rand((96, 263), torch.float32, device)
    bias = rand((96,), torch.float32, device)
    exp = linear.explain(x, w, bias, "gelu")
    assert exp.route == "vendor BLAS" and "F.linear" in exp.variant, exp
    out = poisoned((300, 96), torch.float32, device)
    with Unchanged(x, w, bias):
        assert linear(x, w, bias, "gelu", out=out) is out
    assert_close(out, reference_linear(x.double(), w.double(), bias.double(), "gelu"), torch.float32,
                 scale=dot_scale(263))
    xg = x.clone().requires_grad_(True)
    linear(xg, w, bias, "gelu").sum().backward()
    xr = x.clone().requires_grad_(True)  # the gradient is torch's own: compared with its float32 run
    reference_linear(xr, w, bias, "gelu").sum().backward()
    assert_close(xg.grad, xr.grad.double(), torch.float32, scale=4)


def test_fp32_follows_torch_tf32_setting(backend, device):
    """float32 matmul uses TF32 exactly when torch would on that device (cuda's allow_tf32)."""
    a, b = rand((64, 48), torch.float32, device), rand((48, 32), torch.float32, device)
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        for allow in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allow
            exp = matmul.explain(a, b)
            if exp.route == "triton kernel":
                want = "tf32" if allow and backend.name == "cuda" else "ieee"
                assert exp.config["PRECISION"] == want, exp
            got = matmul(a, b).double().cpu()
            ad, bd = a.double().cpu(), b.double().cpu()
            if allow:  # TF32 keeps 10 mantissa bits: each operand within 2**-10 (truncation) of itself
                err = (got - ad @ bd).abs()
                assert (err <= 2 * 2**-10 * (ad.abs() @ bd.abs()) + 1e-5).all(), float(err.max())
            else:
                assert_close(got.float(), ad @ bd, torch.float32, scale=8)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_large_2d_calls_tma_where_available(backend, device):
    """A TMA config runs the tensor-descriptor kernel where the device has it (elsewhere the same
    config runs the pointer kernel), including a base pointer 2 bytes past alignment (copied first)
    and ``out=``. The config is forced: which shapes the tables send to TMA changes with every
    re-tune, the kernel's correctness must not depend on it."""
    uses_tma = backend.tensor_descriptors(device)
    M, K, N = 256, 520, 264  # 16-byte rows, not multiples of the tiles
    tma_config = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "TMA": True}
    for dtype in (torch.bfloat16, torch.float16) if uses_tma else (torch.bfloat16,):  # interpreter: slow
        with tuning.force(tma_config):
            x, w, b = rand((M, K), dtype, device), rand((N, K), dtype, device), rand((N,), dtype, device)
            # matmul on weight.T: the TMA kernel's K-contiguous B
            assert bool(matmul.explain(x, w.t()).config.get("TMA")) == uses_tma
            got_t = poisoned((M, N), dtype, device)
            matmul(x, w.t(), out=got_t)
            assert_close(got_t, x.double() @ w.double().t(), dtype, scale=K / 16)
            ref = reference_linear(x.double(), w.double(), b.double(), "gelu")
            out = poisoned((M, N), dtype, device)
            with Unchanged(x, w, b):
                linear(x, w, b, "gelu", out=out)
                got = linear(x, w, b, "gelu")
            assert_close(out, ref, dtype, scale=K / 16)
            assert_close(got, ref, dtype, scale=K / 16)
            buf = rand((M * K + 1,), dtype, device)
            shifted = buf[1:].view(M, K)  # data_ptr % 16 == 2
            bt = rand((K, N), dtype, device)
            assert_close(matmul(shifted, bt), shifted.double() @ bt.double(), dtype, scale=K / 16)


def test_tma_repeat_calls_are_hot_and_match(backend, device, tmp_path):
    """Repeated TMA calls skip checks and planning (hot entries build light descriptors): fresh
    data each time, linear with a 3-D x folded into M, matmul on a K-contiguous view, and a
    misaligned base after aligned calls (the full path copies it). A planted table sends every
    call to a TMA config (hot entries are made from table selections, not from forced configs)."""
    if not backend.tensor_descriptors(device):
        pytest.skip(f"backend {backend.name!r} has no tensor descriptors here")

    # measured rules: on cuda an unmeasured one is no evidence against the BLAS (ops/matmul/evidence.py)
    seen = {"shapes": [], "by": "planted by a test"}
    rules = [{"when": {"variant": "tma", "a_layout": "m-major"}, "config": _TMA_SMALL, "measured": seen},  # else cuBLAS
             {"when": {"variant": "tma"}, "config": _TMA_SMALL, "measured": seen},
             {"when": {}, "config": {k: v for k, v in _TMA_SMALL.items() if k != "TMA"}, "measured": seen}]
    tables = {op: {"archs": {backend.arch(device): rules}} for op in ("linear", "matmul")}
    dtype, (B, S, K, N) = torch.bfloat16, (2, 1100, 1000, 640)
    with planted_tables(tmp_path, backend.name, tables):
        _tma_repeat_calls(dtype, B, S, K, N, device)


def _tma_repeat_calls(dtype, B, S, K, N, device):
    for trial in range(3):
        x, w, b = rand((B, S, K), dtype, device), rand((N, K), dtype, device), rand((N,), dtype, device)
        a2, bt = rand((B * S, K), dtype, device), rand((N, K), dtype, device)
        a2t = rand((K, B * S), dtype, device).t()  # M-major A, as a weight gradient's grad.T
        assert linear.explain(x, w, b, "gelu").config.get("TMA") and matmul.explain(a2, bt.t()).config.get("TMA")
        assert "(K, M) transpose" in matmul.explain(a2t, bt.t()).variant
        with Unchanged(x, w, b, a2, bt, a2t):
            got = linear(x, w, b, "gelu")
            got_m = matmul(a2, bt.t())
            got_t = matmul(a2t, bt.t())
        if trial:  # the first call made the entries
            assert linear.hot_entry(x, w, b, "gelu") is not None
            assert matmul.hot_entry(a2, bt.t()) is not None
            assert matmul.hot_entry(a2t, bt.t()) is not None
        ref = reference_linear(x.double(), w.double(), b.double(), "gelu")
        assert_close(got, ref, dtype, scale=K / 16)
        assert_close(got_m, a2.double() @ bt.double().t(), dtype, scale=K / 16)
        assert_close(got_t, a2t.double() @ bt.double().t(), dtype, scale=K / 16)
    buf = rand((B * S * K + 1,), dtype, device)
    shifted = buf[1:].view(B, S, K)  # same shape and strides, base 2 bytes past alignment
    assert_close(linear(shifted, w, b, "gelu"), reference_linear(shifted.double(), w.double(), b.double(), "gelu"),
                 dtype, scale=K / 16)


_TMA_BIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "TMA": True}
_TMA_SMALL = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4, "TMA": True}


@pytest.mark.parametrize("cfg", [
    _TMA_BIG, {**_TMA_BIG, "EPILOGUE_SUBTILE": True}, {**_TMA_BIG, "PERSISTENT": True},
    {**_TMA_BIG, "PERSISTENT": True, "EPILOGUE_SUBTILE": True},
    {**_TMA_SMALL, "PERSISTENT": True, "EPILOGUE_SUBTILE": True},
    {**_TMA_BIG, "BLOCK_N": 128, "PERSISTENT": True, "PROGRAMS_PER_SM": 2, "EPILOGUE_SUBTILE": True},
], ids=["one tile each", "subtile", "persistent", "persistent + subtile", "64x128 persistent + subtile",
        "128x128 persistent x2 + subtile"])
def test_tma_kernel_variants_match_torch(backend, device, cfg):
    """The tensor-descriptor kernel's tunable forms (``xkernels.cli.tune`` candidates) against torch:
    several tiles per program when persistent (more tiles than SMs), edge tiles in M, N and K,
    row-major and K-contiguous B, the bias + activation epilogue whole and in halves. Runs where
    the backend has tensor descriptors (sm90+); on CPU, ``test_tma_kernel_variants_in_the_interpreter``."""
    if not backend.tensor_descriptors(device):
        pytest.skip(f"backend {backend.name!r} has no tensor descriptors here")
    M, K, N = 3000, 520, 2056  # 16-byte rows; 24 x 9 tiles of 128x256
    dtype = torch.bfloat16
    x, w, b = rand((M, K), dtype, device), rand((N, K), dtype, device), rand((N,), dtype, device)
    bt, xt = rand((K, N), dtype, device), rand((K, M), dtype, device).t()  # xt: M-major A (a grad.T)
    with tuning.force(cfg):
        assert matmul.make_plan(matmul.check(xt, bt), backend).tma["a_mmajor"]
        assert_close(matmul(xt, bt), xt.double() @ bt.double(), dtype, scale=K / 16)
        exp = matmul.explain(x, w.t())
        assert exp.config.get("TMA") and exp.config.get("PERSISTENT", False) == cfg.get("PERSISTENT", False)
        assert exp.config.get("EPILOGUE_SUBTILE", False) == cfg.get("EPILOGUE_SUBTILE", False)
        if cfg.get("PERSISTENT"):
            per_sm = cfg.get("PROGRAMS_PER_SM", 1)
            assert exp.programs == min(exp.tiles, per_sm * backend.compute_units(device)) < exp.tiles
        assert_close(matmul(x, w.t()), x.double() @ w.double().t(), dtype, scale=K / 16)
        assert_close(matmul(x, bt), x.double() @ bt.double(), dtype, scale=K / 16)
        for act in ("gelu", "relu", "gelu_tanh"):
            ref = reference_linear(x.double(), w.double(), b.double(), act)
            assert_close(linear(x, w, b, act), ref, dtype, scale=K / 16)


class _InterpretedTma(InterpreterBackend):
    """The interpreter with the TMA path on (Triton's interpreter runs tensor descriptors) and a
    3-SM device, so the tensor-descriptor kernel's forms are checked on CPU too."""

    def tensor_descriptors(self, device=None) -> bool:
        return True

    def compute_units(self, device=None) -> int:
        return 3


_TMA_TINY = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 2, "TMA": True}


@pytest.mark.parametrize("cfg", [
    _TMA_TINY, {**_TMA_TINY, "EPILOGUE_SUBTILE": True}, {**_TMA_TINY, "PERSISTENT": True},
    {**_TMA_TINY, "PERSISTENT": True, "EPILOGUE_SUBTILE": True},
    {**_TMA_TINY, "PERSISTENT": True, "PROGRAMS_PER_SM": 2, "EPILOGUE_SUBTILE": True},
], ids=["one tile each", "subtile", "persistent", "persistent + subtile", "persistent x2 + subtile"])
def test_tma_kernel_variants_in_the_interpreter(cfg):
    """The same forms on CPU, through Triton's interpreter: 5 x 5 edge tiles, over 3 programs when
    persistent (6 with two per SM). float16 only: the interpreter's dot reads bfloat16 as raw bits
    (``UPCAST``). gelu here is the fast erf's (a float16 C)."""
    be = _InterpretedTma()
    if be.unavailable_reason():
        pytest.skip(be.unavailable_reason())
    M, K, N, dtype = 296, 72, 264, torch.float16
    x, w, b = rand((M, K), dtype, "cpu"), rand((N, K), dtype, "cpu"), rand((N,), dtype, "cpu")
    bt, xt = rand((K, N), dtype, "cpu"), rand((K, M), dtype, "cpu").t()  # xt: M-major A (a grad.T)
    cases = [(matmul, (x, w.t()), x.double() @ w.double().t()), (matmul, (x, bt), x.double() @ bt.double()),
             (linear, (x, w, b, "gelu"), reference_linear(x.double(), w.double(), b.double(), "gelu")),
             (linear, (x, w, b, "gelu_tanh"), reference_linear(x.double(), w.double(), b.double(), "gelu_tanh")),
             (matmul, (xt, bt), xt.double() @ bt.double()), (matmul, (xt, w.t()), xt.double() @ w.double().t()),
             (linear, (xt, w, b, "relu"), reference_linear(xt.double(), w.double(), b.double(), "relu"))]
    for op, args, ref in cases:
        call = op.check(*args)
        with tuning.force(cfg):
            plan = op.make_plan(call, be)
        assert plan.tma is not None and plan.grid == (3 * cfg.get("PROGRAMS_PER_SM", 1) if cfg.get("PERSISTENT") else 25,)
        assert plan.tma["a_mmajor"] == (args[0] is xt)
        assert (plan.constexprs["ACT"] == 6) == (args[-1] == "gelu")  # the fast erf (a float16 C)
        c = poisoned((M, N), dtype, "cpu")
        plan.launch(call.a, call.b, c, call.bias, call.slope, ())
        assert_close(c, ref, dtype, scale=K / 16)


_SPLIT = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3, "SPLIT_K": 4}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M,K,N", [(5, 100, 40), (33, 160, 17), (64, 70, 30)],
                         ids=["K not a block multiple", "even split", "last split empty"])
def test_split_k_matches_torch(backend, device, dtype, M, K, N):
    """Split-K plans (fp32 partials + a reduction kernel) give torch's results, with the bias and
    activation applied once, into a poisoned ``out=``, with fresh data on a cached plan."""
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no kernel config to force")
    with tuning.force(_SPLIT):
        for _ in range(2):  # fresh data through the same plan (tests/ops/test_op.py covers hot split-K calls)
            a, b = rand((M, K), dtype, device), rand((K, N), dtype, device)
            w, bias = rand((N, K), dtype, device), rand((N,), dtype, device)
            plan = matmul.make_plan(matmul.check(a, b), backend)
            assert plan.config.get("SPLIT_K") == 4 and "split" in plan.variant
            with Unchanged(a, b, w, bias):
                got = matmul(a, b)
                out = poisoned((M, N), dtype, device)
                linear(a, w, bias, "gelu", out=out)
                got_lin = linear(a, w, bias, "silu")
                got_tanh = linear(a, w, bias, "gelu_tanh")
            assert_close(got_tanh, reference_linear(a.double(), w.double(), bias.double(), "gelu_tanh"), dtype,
                         scale=dot_scale(K))
            assert_close(got, a.double() @ b.double(), dtype, scale=dot_scale(K))
            assert_close(out, reference_linear(a.double(), w.double(), bias.double(), "gelu"), dtype,
                         scale=dot_scale(K))
            assert_close(got_lin, reference_linear(a.double(), w.double(), bias.double(), "silu"), dtype,
                         scale=dot_scale(K))


def test_split_k_applies_to_one_2d_product_only(backend, device):
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no kernel config to force")
    a3, b3 = rand((3, 8, 96), torch.float32, device), rand((3, 96, 16), torch.float32, device)
    short_k = (rand((8, 32), torch.float32, device), rand((32, 16), torch.float32, device))  # one K block
    with tuning.force(_SPLIT):
        for args in ((a3, b3), short_k):
            assert "SPLIT_K" not in matmul.explain(*args).config
            assert_close(matmul(*args), args[0].double() @ args[1].double(), torch.float32, scale=4)


def test_vendor_blas_rule_runs_the_torch_call_and_stays_hot(backend, device, monkeypatch):
    """A ``{"VENDOR": true}`` selection (a class where the tuner measured the device's BLAS faster
    than every kernel config) runs torch.matmul / F.linear + activation, says so in explain(), and
    its hot entry computes each new call's own inputs."""
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no kernel selection")
    with every_matmul_to_vendor(monkeypatch):
        a0, b0 = rand((33, 70), torch.float32, device), rand((70, 45), torch.float32, device)
        e = matmul.explain(a0, b0)
        assert e.route == "vendor BLAS" and e.config == {"VENDOR": True} and "torch.matmul" in e.variant
        assert "vendor BLAS" in str(e)
        for _ in range(3):  # the first call plans, the next ones go through the hot entry
            a, b = rand((33, 70), torch.float32, device), rand((70, 45), torch.float32, device)
            w, bias = rand((45, 70), torch.float32, device), rand((45,), torch.float32, device)
            with Unchanged(a, b, w, bias):
                got, got_lin = matmul(a, b), linear(a, w, bias, "leaky_relu")
            assert_close(got, a.double() @ b.double(), torch.float32, scale=dot_scale(70))
            assert_close(got_lin, reference_linear(a.double(), w.double(), bias.double(), "leaky_relu"),
                         torch.float32, scale=dot_scale(70))
        assert matmul._hot and linear._hot
        out = poisoned((33, 45), torch.float32, device)
        assert matmul(a, b, out=out) is out
        assert_close(out, a.double() @ b.double(), torch.float32, scale=dot_scale(70))


def _blas_epilogue_activations(backend, monkeypatch) -> tuple[str, ...]:
    """The activations of ``backend.vendor_epilogues`` a test can check here: cuda's own list;
    on a CPU backend relu planted (the CPU ``torch._addmm_activation`` computes relu as cuBLASLt
    does, but its GELU is the erf one, so no CPU backend may list gelu_tanh)."""
    if backend.device_type == "cpu":
        monkeypatch.setattr(backend, "vendor_epilogues", ("relu",))
    return backend.vendor_epilogues


@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_bias_and_activation_in_the_blas_epilogue(backend, device, dtype, has_bias, monkeypatch):
    """A backend's ``vendor_epilogues`` (cuda: relu, gelu_tanh) route a half-precision linear
    with that activation to ``torch._addmm_activation`` (no bias: a zero one): explain() says so,
    results match the float64 composition, repeats are hot, ``out=`` is written, and where a
    gradient is required autograd records the unfused PyTorch ops (the fused call has no
    derivative)."""
    if not backend.runs_triton:
        pytest.skip(f"backend {backend.name!r} runs PyTorch: no kernel selection")
    activations = _blas_epilogue_activations(backend, monkeypatch)
    linear._forget()

    def args(gradients=False):
        x, w, b = rand((2, 9, 40), dtype, device), rand((24, 40), dtype, device), rand((24,), dtype, device)
        if gradients:  # pre-activations away from 0: relu's mask must not hinge on rounding
            sign = torch.where(torch.arange(24, device=device) % 2 == 0, 1.0, -1.0)[:, None]
            x, w, b = ((x.abs() + 0.5).to(dtype), ((w.abs() + 0.5) * sign / 40).to(dtype), (b * 0.01).to(dtype))
        return (x, w, b) if has_bias else (x, w, None)

    def ref64(x, w, b, act):
        return reference_linear(x.double(), w.double(), None if b is None else b.double(), act)

    for act in activations:
        e = linear.explain(*args(), act)
        assert e.route == "vendor BLAS" and "_addmm_activation" in e.variant and "vendor_epilogues" in e.config_source
        assert ("zero bias" in e.variant) is not has_bias
        for _ in range(3):  # the first call plans, the next ones run the hot entry
            x, w, b = args()
            with Unchanged(x, w, *([b] if has_bias else [])):
                got = linear(x, w, b, act)
            assert_close(got, ref64(x, w, b, act), dtype, scale=dot_scale(40))
        assert linear.hot_entry(x, w, b, act) is not None
        out = poisoned((2, 9, 24), dtype, device)
        assert linear(x, w, b, act, out=out) is out
        assert_close(out, ref64(x, w, b, act), dtype, scale=dot_scale(40))
        inputs = [t for t in args(gradients=True) if t is not None]
        ref = [t.detach().double().requires_grad_() for t in inputs]
        ref64(*ref, *([] if has_bias else [None]), act).square().sum().backward()
        for fresh in (False, True):  # the hot entry's autograd_entry; a first call (the op's autograd)
            if fresh:
                linear._forget()
            leaves = [t.detach().clone().requires_grad_() for t in inputs]
            y = linear(*leaves, *([] if has_bias else [None]), act)
            assert y.grad_fn is not None and "Addmm" not in type(y.grad_fn).__name__  # no _addmm_activation
            y.float().square().sum().backward()
            for mine, want in zip(leaves, ref):
                assert_close(mine.grad, want.grad, dtype, scale=4 * dot_scale(40))
    # not for: float32, an activation not listed, a forced config
    x, w, b = args()
    assert "vendor_epilogues" not in (linear.explain(x.float(), w.float(), None if b is None else b.float(),
                                                     "relu").config_source or "")
    assert "vendor_epilogues" not in (linear.explain(x, w, b, "silu").config_source or "")
    with tuning.force({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}):
        assert linear.explain(x, w, b, "relu").route == "triton kernel"
    linear._forget()


def test_zero_bias_is_kept_per_size_dtype_and_device(backend, device):
    """The zero bias of a bias-less epilogue call is made once per (n, dtype, device)."""
    from xkernels.ops.matmul.vendor import zero_bias

    z = zero_bias(7, torch.float16, device)
    assert z is zero_bias(7, torch.float16, device) and z.shape == (7,) and not z.any()
    assert zero_bias(7, torch.bfloat16, device) is not z and zero_bias(8, torch.float16, device) is not z
    from xkernels.ops.matmul.vendor import _ZEROS, _ZEROS_LIMIT

    for n in range(1, 2 * _ZEROS_LIMIT):  # many widths: the cache stays bounded
        assert not zero_bias(n, torch.float16, device).any()
    assert len(_ZEROS) <= _ZEROS_LIMIT


def test_a_graph_capture_makes_its_own_zero_bias(backend, device):
    """A zero bias first asked for inside a CUDA graph capture is not kept (its zeros are written
    by the graph); a captured bias-less epilogue linear replays correctly on new inputs."""
    from xkernels.ops.matmul.vendor import _ZEROS

    if backend.name != "cuda" or "relu" not in backend.vendor_epilogues:
        pytest.skip("CUDA graphs of the BLAS epilogue route: cuda only")
    x, w = rand((64, 40), torch.bfloat16, device), rand((24, 40), torch.bfloat16, device)
    stream = torch.cuda.Stream()  # warm up on the capture's stream (PyTorch's recipe for graphs)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            linear(x, w, None, "relu")  # plans, then hot
    torch.cuda.current_stream().wait_stream(stream)
    _ZEROS.clear()  # the capture below asks for the zero bias first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y = linear(x, w, None, "relu")
    assert not _ZEROS, "a zero bias made during the capture was kept"
    x.copy_(rand((64, 40), torch.bfloat16, device))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(y, reference_linear(x.double(), w.double(), None, "relu"), torch.bfloat16, scale=dot_scale(40))
    assert_close(linear(x, w, None, "relu"), reference_linear(x.double(), w.double(), None, "relu"), torch.bfloat16,
                 scale=dot_scale(40))  # outside the graph: a zero bias of its own, kept


def test_the_cuda_blas_gelu_epilogue_is_the_tanh_approximation(backend, device):
    """The premise of cuda's ``vendor_epilogues`` listing gelu_tanh: cuBLASLt's GELU epilogue,
    reached through ``torch._addmm_activation``, is ``F.gelu(approximate="tanh")``, not the erf
    GELU (the two differ by up to ~5e-4, far above float32 GEMM rounding here)."""
    if backend.name != "cuda":
        pytest.skip("cuBLASLt's epilogue: cuda only")
    for m in (64, 1):  # cuBLASLt's epilogue, and the path without it (one row: gelu after the GEMM)
        x, w, b = (torch.randn(s, device=device, dtype=torch.float64).float() for s in ((m, 32), (32, 4096), (4096,)))
        got = torch._addmm_activation(b, x, w, use_gelu=True).double()
        pre = torch.addmm(b.double(), x.double(), w.double())
        tanh, erf = torch.nn.functional.gelu(pre, approximate="tanh"), torch.nn.functional.gelu(pre)
        assert (got - tanh).abs().max() < 5e-5 < (tanh - erf).abs().max() / 4, m
