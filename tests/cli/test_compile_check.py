"""xkernels.cli.compile_check: which npu compilations the offline check (tox -e npu-compile) runs.

These tests need no Ascend toolchain: they check the case list (SoCs, entries, epilogues,
layouts); tests/npu_compile compiles cases with triton-ascend and bishengir-compile.
"""

from __future__ import annotations

import pytest
import torch

from helpers import planted_tables
from xkernels.backends import npu
from xkernels.cli.compile_check import collect, collect_cases, default_socs
from xkernels.ops.matmul import ACTIVATIONS
from xkernels.ops.matmul import kernels as matmul_kernels

A2, A3, A5 = "Ascend910B3", "Ascend910_9392", "Ascend950PR_9599"
A3_SOCS = ["Ascend910_9362", "Ascend910_9372", "Ascend910_9381", "Ascend910_9382", "Ascend910_9391", "Ascend910_9392"]


def _mm(cases, kernel=None):
    return [c for c in cases if c.op in ("matmul", "linear") and (kernel is None or c.kernel is kernel)]


def test_every_a2_a3_and_a5_soc_is_checked():
    socs = default_socs()
    assert socs == list(npu.SOCS)
    assert {"Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4", *A3_SOCS, A5, "Ascend910_9579"} <= set(socs)
    cases, notes = collect(None, ["linear"])
    assert notes == []
    for soc in socs:
        assert {c.dtype for c in cases if c.soc == soc} == {"float16", "bfloat16", "float32"}, soc


def test_shipped_tables_have_no_never_selected_entries():
    cases, notes = collect([A2, A3, A5])
    assert notes == []
    assert {c.op for c in cases} == {"broadcast", "add", "matmul", "linear", "gated_linear", "add_layer_norm",
                                     "add_rms_norm", "rotary_embedding"}


def test_a3_reads_its_family_then_the_a2_rules():
    assert npu.table_keys(A3) == [A3, "Ascend910_93", "Ascend910B"]
    configs = {c.config for c in collect_cases([A3], ["linear"])}
    assert configs and all("[Ascend910B] rule" in c for c in configs)
    # the same entries and epilogues as on an A2 part (only the SoC differs)
    a2 = {(c.dtype, c.config) for c in collect_cases([A2], ["linear"])}
    assert a2 == {(c.dtype, c.config) for c in collect_cases([A3], ["linear"])}


def test_linear_cases_cover_every_activation_with_and_without_bias():
    cases = collect_cases([A3], ["linear"])
    for dtype in ("float16", "bfloat16", "float32"):
        got = {(c.constants["ACT"], c.constants["HAS_BIAS"]) for c in cases if c.dtype == dtype}
        assert got == {(code, bias) for code in ACTIVATIONS.values() for bias in (True, False)}, dtype


def test_matmul_cases_cover_the_backward_layouts():
    """grad_a = grad @ b.T (B transposed: sbk == 1) and grad_b = a.T @ grad (A transposed: sam == 1)
    compile with those unit strides specialized, as at launch."""
    cases = collect_cases([A2], ["matmul"])
    for dtype in ("float16", "bfloat16", "float32"):
        mine = [c for c in cases if c.dtype == dtype]
        by_layout = {c.config.split("|")[1]: c.constants for c in mine}
        assert by_layout["contiguous"].get("sak") == 1 and by_layout["contiguous"].get("sbn") == 1
        assert by_layout["A transposed"].get("sam") == 1 and "sak" not in by_layout["A transposed"]
        assert by_layout["B transposed"].get("sbk") == 1 and "sbn" not in by_layout["B transposed"]
        t = by_layout["A and B transposed"]
        assert t.get("sam") == 1 and t.get("sbk") == 1 and "sak" not in t and "sbn" not in t
        assert "batched, broadcast batch" in by_layout


def test_planted_rule_behind_a_catch_all_is_reported_not_compiled(tmp_path):
    tables = {"linear": {"archs": {"Ascend910_93": [
        {"when": {"activation": "none"}, "config": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}},
        {"when": {"activation": "none", "dtype": "float16"}, "config": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}},
    ]}}}
    with planted_tables(tmp_path, "npu", tables):
        cases, notes = collect([A3], ["linear"])
    assert any("[Ascend910_93] rule 1" in n and "never selected" in n for n in notes), notes
    assert not any("[Ascend910_93] rule 1" in c.config for c in cases)
    planted = [c for c in cases if "[Ascend910_93] rule 0" in c.config]
    assert {(c.dtype, c.constants["ACT"]) for c in planted} == {(d, 0) for d in ("float16", "bfloat16", "float32")}
    # the shipped rules that only calls without an activation reached are now never selected
    assert any("[Ascend910B] rule 1" in n for n in notes)


def test_split_k_entry_compiles_partials_and_reduction(tmp_path):
    tables = {"linear": {"archs": {"Ascend910B": [
        {"when": {"dtype": "float16"}, "config": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 4}},
    ]}}}
    with planted_tables(tmp_path, "npu", tables):
        cases, notes = collect([A2], ["linear"])
    assert notes == []
    planted = [c for c in cases if c.dtype == "float16"]
    partials = [c for c in planted if c.config.endswith("(partials)")]
    reductions = _mm(planted, matmul_kernels.splitk_reduce_kernel)
    assert partials and all(c.constants["SPLIT_K"] == 4 and c.constants["ACT"] == 0 for c in partials)
    assert {(c.constants["ACT"], c.constants["HAS_BIAS"]) for c in reductions} == {
        (code, bias) for code in ACTIVATIONS.values() for bias in (True, False)}
    assert all(c.constants["SPLIT_K"] == 4 for c in reductions)
    # the same entry on a large call runs unsplit: that path is compiled too
    assert any(c.kernel is matmul_kernels.matmul_kernel and c.constants["SPLIT_K"] == 1 for c in planted)


def test_shape_conditioned_rules_reach_the_candidates_section(tmp_path, monkeypatch):
    """Without a rule for every call of a class the wave model is reachable: the table's candidates
    are compiled, the built-in ones where no group applies, and a shape-conditioned rule at a
    shape inside its range (its effective tile)."""
    monkeypatch.setattr(npu, "table_keys", lambda soc: [soc, "Planted"])  # the shipped rules out of the way
    tables = {"matmul": {
        "archs": {"Planted": [{"when": {"m_max": 32}, "config": {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64}}]},
        "candidates": {"Planted": [{"when": {"dtype": ["float16", "bfloat16"]}, "configs": [
            {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 64, "cost": [1.0, 0.0, 0.0]}]}]},
    }}
    with planted_tables(tmp_path, "npu", tables):
        cases, notes = collect([A2], ["matmul"])
    assert notes == []
    ruled = [c for c in cases if "[Planted] rule 0" in c.config]
    assert {c.dtype for c in ruled} == {"float16", "bfloat16", "float32"}
    assert all(c.constants["BLOCK_M"] == 32 and c.constants["BLOCK_N"] == 64 for c in ruled)
    cands = [c for c in cases if "[Planted] candidates 0, config 0" in c.config]
    assert {c.dtype for c in cands} == {"float16", "bfloat16"}
    assert all(c.constants["BLOCK_M"] == 32 and c.constants["BLOCK_N"] == 128 for c in cands)
    # float32 has no candidates group: the built-in candidates stand in for it
    assert {c.dtype for c in cases if "built-in candidate" in c.config} == {"float32"}


def test_unknown_soc_is_a_value_error():
    with pytest.raises(ValueError, match="Ascend999.*Ascend910_9392"):
        collect(["Ascend999"], ["add"])


def test_entry_outside_every_checked_layout_is_reported(tmp_path):
    tables = {"matmul": {"archs": {"Ascend910B": [
        {"when": {"batch_min": 8}, "config": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}}]}}}
    with planted_tables(tmp_path, "npu", tables):
        cases, notes = collect([A2], ["matmul"])
    assert any("rule 0" in n and "no layout of the check falls in its shape range" in n for n in notes), notes
    assert not any("BLOCK_M=64,BLOCK_N=64,BLOCK_K=64" in c.config for c in cases)


def test_a5_reads_only_its_own_rules():
    """An A5 SoC compiles the Ascend950 rules (sized to its 248 KiB UB / 256 KiB L0C), none of the
    A2 ones, with every op, dtype, epilogue and layout an A2 SoC gets."""
    assert npu.table_keys(A5) == [A5, "Ascend950"]
    cases, notes = collect([A5])
    assert notes == []
    assert all("[Ascend950]" in c.config for c in cases if c.op not in ("add", "broadcast"))
    a2 = collect_cases([A2])
    assert {(c.op, c.dtype) for c in cases} == {(c.op, c.dtype) for c in a2}
    layout = lambda c: c.config.split("|")[1]  # noqa: E731
    assert {(c.op, c.dtype, layout(c)) for c in cases} == {(c.op, c.dtype, layout(c)) for c in a2}
    mm = [c for c in cases if c.op == "matmul" and "|contiguous|" in c.config and c.dtype == "float16"]
    assert mm and all((c.constants["BLOCK_M"], c.constants["BLOCK_N"]) == (128, 256) for c in mm)


def test_an_op_joins_by_declaring_compile_cases(monkeypatch):
    """An op made anywhere (a fused op under ops/fused) is checked once it implements
    ``compile_cases``; the check names no op. Ops without it are not listed."""
    from xkernels.cli.compile_check import compile_ops
    from xkernels.compile_cases import CompileTarget
    from xkernels.ops import op as op_module

    assert list(compile_ops()) == ["add", "broadcast", "matmul", "linear", "gated_linear", "add_layer_norm",
                                   "add_rms_norm", "rotary_embedding"]
    seen: list[CompileTarget] = []

    class Toy(op_module.Op):
        name = "toy_fused"

        def compile_cases(self, target):
            seen.append(target)
            assert target.sections("broadcast") and target.backend.max_programs("cube") == 36
            args = (torch.empty(8, device="meta"), torch.empty(8, device="meta"), torch.empty(8, device="meta"), 8, 1)
            yield target.case(self.name, matmul_kernels.splitk_reduce_kernel, args, {}, "float32", "toy")

    class NoKernels(op_module.Op):
        name = "toy_torch_only"

    monkeypatch.setattr(op_module, "REGISTERED", dict(op_module.REGISTERED))
    Toy(), NoKernels()
    assert "toy_fused" in compile_ops() and "toy_torch_only" not in compile_ops()
    (case,) = collect_cases([A5], ["toy_fused"])
    assert [t.soc for t in seen] == [A5] and case.soc == A5 and case.op == "toy_fused"
    assert case.signature["ws_ptr"] == "*fp32" and case.signature["M"] == "i32" and case.constants["N"] == 1
    with pytest.raises(ValueError, match="unknown op.*toy_torch_only"):
        collect([A5], ["toy_torch_only"])
