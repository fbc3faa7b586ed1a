"""The fused ops' npu compile cases (ops/fused/add_norm_compile.py, ops/fused/gated_linear_compile.py)
as xkernels.cli.compile_check lists them: every table entry, dtype and kernel variant, from the
ops' own plans. No Ascend toolchain needed; tests/npu_compile compiles them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import planted_tables
from xkernels.backends import npu
from xkernels.cli.compile_check import collect, collect_cases
from xkernels.ops.fused import add_norm_kernels, experts_routing_kernels, gated_linear_kernels
from xkernels.ops.fused.gated_linear import ACTIVATIONS as GATED_ACTIVATIONS
from xkernels.ops.matmul.plan import ACTIVATIONS

A2, A3, A5 = "Ascend910B3", "Ascend910_9392", "Ascend950PR_9599"
ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("HAS_RES", "HAS_W", "STORE_SUM", "STORE_STATS", "ONE_CHUNK", "PERSISTENT", "INDEX_64")


def _table(name: str) -> dict:
    return json.loads((ROOT / "ops" / "tuning" / "npu" / f"{name}.json").read_text())


def _where(soc: str, table: str, backward: bool = False) -> set[str]:
    """Every shipped forward rule of ``table`` an SoC reads (``backward``: every rule with
    ``"pass": "backward"``), as the case labels name it."""
    archs = _table(table)["archs"]
    return {f"{table}.json [{k}] rule {i}" for k in npu.table_keys(soc) for i, r in enumerate(archs.get(k, ()))
            if (r.get("when", {}).get("pass") == "backward") == backward}


@pytest.mark.parametrize("soc", [A2, A3, A5])
def test_add_norm_cases_cover_every_entry_dtype_and_variant(soc):
    cases, notes = collect([soc], ["add_layer_norm", "add_rms_norm"])
    assert notes == []
    cases = [c for c in cases if c.kernel is add_norm_kernels.add_norm_kernel]
    for op, rms in (("add_layer_norm", False), ("add_rms_norm", True)):
        mine = [c for c in cases if c.op == op]
        assert all(c.constants["RMS"] is rms for c in mine)
        assert {c.config.rsplit("|", 1)[1] for c in mine} == _where(soc, "add_norm"), op
        for dtype in ("float16", "bfloat16", "float32"):
            got = [c.constants for c in mine if c.dtype == dtype]
            for flag in FLAGS:
                assert {k[flag] for k in got} == {True, False}, (op, dtype, flag)
            assert {k["HAS_B"] for k in got} == ({False} if rms else {True, False})
            # the autograd forward in the persistent loop with 64-bit offsets, on both code paths
            assert {k["ONE_CHUNK"] for k in got if k["INDEX_64"] and k["PERSISTENT"] and k["STORE_STATS"]} == {
                True, False}
    # the cases carry the plan's own launch: s/y in the kernel dtype, statistics fp32, the mixed-
    # precision call's fp32 weight, unit-free row strides (ints, one i64 when offsets need it)
    c = next(c for c in cases if c.dtype == "bfloat16" and "fp32 w" in c.config)
    assert c.signature["x_ptr"] == c.signature["y_ptr"] == "*bf16" and c.signature["w_ptr"] == "*fp32"
    full = next(c for c in cases if c.op == "add_layer_norm" and c.dtype == "float16" and c.constants["STORE_STATS"])
    assert full.signature["mean_ptr"] == full.signature["rstd_ptr"] == "*fp32"
    assert full.signature["eps"] == full.signature["offset"] == "fp32"


@pytest.mark.parametrize("soc", [A2, A5])
def test_add_norm_backward_cases_cover_every_rule_form_and_parameter_sum(soc):
    """The backward kernel per ``"pass": "backward"`` rule, dtype and form (every gradient from
    the saved sum; the sum recomputed, from a bf16 x and an fp32 residual where the sum is fp32;
    d(x) alone; 64-bit offsets; chunked
    rows where the rule's range has them), each full form followed by ``part_sum_kernel`` for
    parameters in the activations' dtype and in fp32, planned with the SoC's cores."""
    cases, _ = collect([soc], ["add_layer_norm", "add_rms_norm"])
    bwd = [c for c in cases if c.kernel is add_norm_kernels.add_norm_bwd_kernel]
    sums = [c for c in cases if c.kernel is add_norm_kernels.part_sum_kernel]
    assert bwd and sums and len(bwd) + len(sums) + sum(
        c.kernel is add_norm_kernels.add_norm_kernel for c in cases) == len(cases)
    for op, rms in (("add_layer_norm", False), ("add_rms_norm", True)):
        mine = [c for c in bwd if c.op == op]
        assert {c.config.rsplit("|", 1)[1] for c in mine} == _where(soc, "add_norm", backward=True), op
        for dtype in ("float16", "bfloat16", "float32"):
            got = [c.constants for c in mine if c.dtype == dtype]
            for flag in ("HAS_S", "HAS_RES", "HAS_DS", "NEED_DW", "ONE_CHUNK", "INDEX_64"):
                assert {k[flag] for k in got} == {True, False}, (op, dtype, flag)
            # d(residual) apart from d(x) only where the sum is fp32 (a bf16 x, an fp32 residual)
            assert {k["STORE_R"] for k in got} == ({True, False} if dtype == "float32" else {False}), (op, dtype)
            assert {k["NEED_DB"] for k in got} == ({False} if rms else {True, False}), (op, dtype)
            assert all(k["RMS"] is rms for k in got)
            params = {(c.signature["dw_ptr"], c.constants["NEED_DB"]) for c in sums if c.op == op and c.dtype == dtype}
            want_dw = {"*fp32", {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}[dtype]}
            assert {p for p, _ in params} == want_dw and {b for _, b in params} == {not rms}, (op, dtype, params)
    assert all(c.constants["BLOCK_P"] * c.constants["BLOCK_N"] <= 2048 for c in sums)


def test_add_norm_a5_reads_its_own_larger_tiles():
    def tiles(soc):
        return {(c.dtype, c.constants["BLOCK_M"] * c.constants["BLOCK_N"]) for c in collect_cases([soc], ["add_rms_norm"])
                if c.kernel is add_norm_kernels.add_norm_kernel}

    a5, a2 = tiles(A5), tiles(A2)
    assert max(n for d, n in a5 if d == "float16") == 2 * max(n for d, n in a2 if d == "float16") == 8192
    assert max(n for d, n in a5 if d == "float32") == 2 * max(n for d, n in a2 if d == "float32") == 4096


@pytest.mark.parametrize("soc", [A2, A5])
def test_gated_linear_cases_cover_every_entry_epilogue_and_variant(soc):
    everything, notes = collect([soc], ["gated_linear"])
    assert notes == []
    element_wise = (gated_linear_kernels.gate_grad_kernel, gated_linear_kernels.gate_kernel)
    clamped = [c for c in everything if c.kernel in element_wise and c.constants["CLAMPED"]]  # GPT-OSS's gate
    grads = [c for c in everything if c.kernel is gated_linear_kernels.gate_grad_kernel and c not in clamped]
    passes = [c for c in everything if c.kernel is gated_linear_kernels.gate_kernel and c not in clamped]
    routing_kernels = (experts_routing_kernels.combine_kernel, experts_routing_kernels.combine_grad_kernel)
    routing = [c for c in everything if c.kernel in routing_kernels]
    cases = [c for c in everything if c.kernel not in element_wise + routing_kernels]
    assert all(c.kernel is gated_linear_kernels.gated_linear_kernel for c in cases)  # npu: never the vendor route
    assert {c.config.rsplit("|", 1)[1] for c in cases} == _where(soc, "gated_linear")
    # the backward's element-wise kernel after each forward that keeps gate and up, at its (M, I)
    kept = [c for c in cases if c.constants["STORE_PRE"]]
    assert len(grads) == len(kept) and all(c.config.startswith("gate grad kernel") for c in grads)
    assert sorted((c.dtype, c.config.rsplit("|", 1)[1]) for c in grads) == sorted(
        (c.dtype, c.config.rsplit("|", 1)[1]) for c in kept)  # per dtype and table entry
    for dtype in ("float16", "bfloat16", "float32"):
        got = [c.constants for c in grads if c.dtype == dtype]
        assert {k["ACT"] for k in got} == {ACTIVATIONS[a] for a in GATED_ACTIVATIONS}
        assert {k["INDEX_64"] for k in got} == {True, False}, dtype  # the M x I past 2**31 call
    # after each concatenated forward keeping gate and up, the gate pass on its (M, 2I) halves
    kept_wide = [c for c in kept if "[Wg; Wu]" in c.config]
    assert sorted((c.dtype, c.constants["ACT"]) for c in passes) == sorted(
        (c.dtype, c.constants["ACT"]) for c in kept_wide)
    assert all(c.config.startswith("gate pass kernel") and "sgm" not in c.constants
               and c.constants["sgn"] == c.constants["sun"] == c.constants["syn"] == 1 for c in passes)
    # GPT-OSS's clamped gate, both ways, after each concatenated SiLU forward: interleaved columns
    silu_wide = sorted(c.dtype for c in kept_wide if c.constants["ACT"] == ACTIVATIONS["silu"])
    for kernel in element_wise:
        assert sorted(c.dtype for c in clamped if c.kernel is kernel) == silu_wide and silu_wide
    # the routing passes around each such experts layer: the weighted sum (router weights of the
    # class's dtype and fp32), the gather's backward, the weighted sum's backward; top-k 2 and 8; bf16 past 2**31
    for dtype in ("float16", "bfloat16", "float32"):
        got = [c for c in routing if c.dtype == dtype]
        kinds = {(c.kernel, c.constants.get("WEIGHTED", True), c.constants["K"]) for c in got}
        assert kinds == {(k, w, top_k) for top_k in (2, 8) for k, w in ((routing_kernels[0], True),
                                                                          (routing_kernels[0], False),
                                                                          (routing_kernels[1], True))}, dtype
        assert {c.constants["INDEX_64"] for c in got} == ({True, False} if dtype == "bfloat16" else {False})
        assert {c.constants["ROUND"] for c in got} == ({0} if dtype == "float32" else {0, 1 if dtype == "float16" else 2})
        assert all(c.constants["ORDERED"] and c.config.startswith("routing ") for c in got)
    # column stride 2 (a stride of 1 would be specialized into the constants)
    assert all("sgn" not in c.constants and "sun" not in c.constants and "clamped" in c.config for c in clamped)
    wide = [c for c in grads if "[Wg; Wu]" in c.config]  # gate, up and their gradients: (M, 2I) halves
    assert wide and all("sgm" not in c.constants and c.constants["sgn"] == c.constants["san"] == 1 for c in wide)
    acts = {ACTIVATIONS[a] for a in GATED_ACTIVATIONS}
    for dtype in ("float16", "bfloat16", "float32"):
        got = [c.constants for c in cases if c.dtype == dtype]
        assert {(k["ACT"], k["HAS_BIAS"], k["HAS_UP_BIAS"]) for k in got} == {
            (a, g, u) for a in acts for g in (True, False) for u in (True, False)}
        assert {(k["ACT"], k["STORE_PRE"]) for k in got} == {(a, s) for a in acts for s in (True, False)}
        for flag in ("EVEN_K", "PERSISTENT", "INDEX_64"):
            assert {k[flag] for k in got} == {True, False}, (dtype, flag)
        # the weights are read K-contiguous (the (K, N) view of (N, K)) and y row-major, as at launch
        assert all(k["sgk"] == k["suk"] == k["sxk"] == k["syn"] == 1 for k in got)
    concat = [c for c in cases if "[Wg; Wu]" in c.config]
    assert concat and all(c.constants["HAS_BIAS"] == c.constants["HAS_UP_BIAS"] for c in concat)
    if soc == A5:
        assert {(c.constants["BLOCK_M"], c.constants["BLOCK_N"]) for c in cases} == {(128, 128)}


def test_planted_vendor_rule_compiles_the_gate_kernel(tmp_path):
    """A ``VENDOR`` rule (the cuda tables' route) is compiled as its Triton half, ``gate_kernel``,
    per activation, reading the BLAS's gate/up results (strided halves of one (M, 2I) result for
    a concatenated weight)."""
    tables = {"gated_linear": {"archs": {"Ascend910B": [{"when": {"dtype": ["bfloat16"]}, "config": {"VENDOR": True}}]}}}
    with planted_tables(tmp_path, "npu", tables):
        cases, notes = collect([A2], ["gated_linear"])
    assert notes == []
    gate = [c for c in cases if c.kernel is gated_linear_kernels.gate_kernel
            and not c.config.startswith("gate pass kernel")]  # not the experts' pass after a kept forward
    assert gate and all(c.dtype == "bfloat16" and c.config.startswith("VENDOR=True") for c in gate)
    assert {c.constants["ACT"] for c in gate} == {ACTIVATIONS[a] for a in GATED_ACTIVATIONS}
    concat = [c for c in gate if "[Wg; Wu]" in c.config]
    assert concat and all("sgm" not in c.constants and c.constants["sgn"] == 1 for c in concat)
    assert all(c.signature["g_ptr"] == "*bf16" for c in gate)
    assert {c.dtype for c in cases if c.kernel is gated_linear_kernels.gated_linear_kernel} == {"float16", "float32"}
