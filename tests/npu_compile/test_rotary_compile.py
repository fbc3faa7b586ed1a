"""rotary_embedding's npu compile cases (ops/fused/rotary_compile.py) and a planted entry too big for
the unified buffer.

The case tests run anywhere (no Ascend toolchain: they check what xkernels.cli.compile_check lists,
from the op's own plans). The planted-entry tests compile, so they need triton-ascend and
bishengir-compile (``tox -e npu-compile``); elsewhere they are skipped, and under
``XKERNELS_REQUIRE_NPU_COMPILE`` a missing toolchain fails them instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import planted_tables
from xkernels.backends import npu
from xkernels.cli.compile_check import collect, collect_cases
from xkernels.cli.npu_compile import compilation_key
from xkernels.ops.fused import rotary_kernels

OP = "rotary_embedding"
A2, A3, A5, A5_SMALL = "Ascend910B3", "Ascend910_9392", "Ascend950PR_9599", "Ascend910_950z"
ROOT = Path(__file__).resolve().parents[2]
DTYPES = ("float16", "bfloat16", "float32")
PTR = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}
CONSTEXPRS = {"BLOCK_R", "BLOCK_D", "BACKWARD", "INTERLEAVED", "SPLIT_PAIRS", "PERSISTENT", "INDEX_64"}


def _rules(soc: str) -> dict[str, dict]:
    """Every shipped rule of the npu rotary table an SoC reads, by its case label."""
    archs = json.loads((ROOT / "ops" / "tuning" / "npu" / "rotary.json").read_text())["archs"]
    return {f"rotary.json [{k}] rule {i}": r for k in [*npu.table_keys(soc), "default"]
            for i, r in enumerate(archs.get(k, ()))}


def _layout(case) -> str:
    return case.config.split("|")[1]


def _ints_at_one(case) -> set[str]:
    """The runtime ints the case specializes (equal to 1 at launch)."""
    return set(case.constants) - CONSTEXPRS


@pytest.mark.parametrize("soc", [A2, A3, A5, A5_SMALL])
def test_rotary_cases_cover_every_entry_dtype_pass_and_variant(soc):
    cases, notes = collect([soc], [OP])
    assert notes == []
    assert cases and all(c.kernel is rotary_kernels.rotary_kernel for c in cases)
    rules = _rules(soc)
    assert {c.config.rsplit("|", 1)[1] for c in cases} == set(rules)
    for dtype in DTYPES:
        for backward in (False, True):
            mine = [c for c in cases if c.dtype == dtype and c.constants["BACKWARD"] is backward]
            assert mine and all(_layout(c).startswith("backward" if backward else "forward") for c in mine)
            got = [c.constants for c in mine]
            for flag in ("INTERLEAVED", "PERSISTENT", "INDEX_64"):
                assert {k[flag] for k in got} == {True, False}, (soc, dtype, backward, flag)
            assert {k["BLOCK_D"] for k in got} == {64, 128, 256}
            assert all(c.signature[p] == PTR[dtype] for c in mine
                       for p in ("q_ptr", "qo_ptr", "k_ptr", "ko_ptr", "cos_ptr", "sin_ptr"))
            for c in mine:
                where = c.config.rsplit("|", 1)[1]
                # the entry's tile: ELEMENTS / BLOCK_D rows where the call has that many (not decode)
                if "decode (1, H, 1, D)" not in c.config:
                    assert c.constants["BLOCK_R"] * c.constants["BLOCK_D"] == rules[where]["config"]["ELEMENTS"]
                # no loop for one sequence's decode; every other call has more row tiles than cores
                assert c.constants["PERSISTENT"] is ("decode (1, H, 1, D)" not in c.config), c.config
                assert c.constants["INDEX_64"] is ("offsets past 2**31" in c.config), c.config
                assert ("index_64" in c.config) is c.constants["INDEX_64"]
                assert c.constants["INTERLEAVED"] is ("adjacent pairs" in c.config), c.config
                assert c.constants["SPLIT_PAIRS"] is False, c.config  # the npu table gathers (its source)


def test_rotary_cases_carry_the_launch_specialization():
    """The runtime arguments are those RotaryPlan.run passes: sizes equal to 1 specialized as Triton
    does at launch (decode's batch and sequence; packed tokens' padded leading dim), nothing else;
    the partial-rotary calls (head dim 128 / rotary 64, 80 / 32) are the full 128's compilations."""
    cases = [c for c in collect_cases([A2], [OP]) if c.dtype == "bfloat16"]
    for c in cases:
        layout = _layout(c)
        if "decode (1, H, 1, D)" in layout:
            want = {"QA", "QC", "KA", "KC"}
        elif "batched decode" in layout:
            want = {"QC", "KC"}
        elif "packed tokens" in layout:
            want = {"QA", "KA"}
        else:
            want = set()
        assert _ints_at_one(c) == want, c.config
        assert c.signature["D"] == c.signature["HALF"] == "i32"
    for backward in ("forward", "backward"):
        for call in ("prefill (B, H, S, D)", "decode (1, H, 1, D)"):
            full = [c for c in cases if _layout(c).startswith(f"{backward}, head dim 128, {call}")
                    and "adjacent pairs" not in c.config]
            partial = [c for c in cases if _layout(c).startswith(backward) and call in c.config and "rotary " in c.config]
            assert len(full) == 1 and len(partial) == 2, (backward, call)
            assert {compilation_key(c) for c in full + partial} == {compilation_key(full[0])}


def test_rotary_compilations_stay_few():
    """The chain compiles each case once per memory class: the rotary op adds 42 compilations per
    class (A2/A3, A5) to ``tox -e npu-compile``. A bound, so that a new layout or head dim is a
    choice about the chain's time."""
    cases = collect_cases(None, [OP])
    keys = {compilation_key(c) for c in cases}
    classes = {npu.memory_class(s) for s in npu.SOCS}
    assert len(cases) == 66 * len(npu.SOCS)
    assert len(keys) <= 46 * len(classes), len(keys)


def test_shape_conditioned_rules_get_the_calls_in_their_range(tmp_path):
    """A rule on the head dim (as the cuda table's ``d_max``) is compiled at the head dims it takes;
    a rule whose range no call of the list reaches is a note, not a case."""
    tables = {"rotary": {"archs": {A2: [  # the SoC's own key: read before the shipped family rules
        {"when": {"d_min": 512}, "config": {"ELEMENTS": 4096}},
        {"when": {"d_max": 64, "dtype": ["float16"]}, "config": {"ELEMENTS": 1024}},
    ]}}}
    with planted_tables(tmp_path, "npu", tables):
        cases, notes = collect([A2], [OP])
    small = [c for c in cases if f"[{A2}] rule 1" in c.config]
    assert small and all(c.dtype == "float16" and c.constants["BLOCK_D"] == 64 for c in small)
    assert {c.constants["BLOCK_R"] for c in small} == {16}
    assert not any(f"[{A2}] rule 0" in c.config for c in cases)
    assert len(notes) == 6 and all("rule 0" in n and "no layout in its range" in n for n in notes), notes
    # the shipped rules still take every class, head dim 64 included
    assert {c.dtype for c in cases if "[Ascend910B]" in c.config and c.constants["BLOCK_D"] == 64} == set(DTYPES)


# --------------------------------------------------------------------------- compiled (toolchain)


def _toolchain():
    from xkernels.cli import npu_compile

    bishengir, problem = npu_compile.check_environment()
    if problem:
        if os.environ.get("XKERNELS_REQUIRE_NPU_COMPILE"):  # tox -e npu-compile: never pass by skipping
            raise RuntimeError(f"offline NPU compile check unavailable: {problem}")
        pytest.skip(f"offline NPU compile check unavailable: {problem}")
    return npu_compile, bishengir


#: per family: the SoC and the compiler's UB limit in bits (rotary has no tl.dot: no L0C entry).
#: A 32768-element fp16 tile (256 rows of a 128-wide head) needs 384 KiB on A2, 449 KiB on A5.
ROTARY_PLANTED = {"Ascend910B": ("Ascend910B1", "bits while 1572864 bits available", "> 192 KiB",
                                 "bishengir-compile"),
                  "Ascend950": ("Ascend950PR_9599", "bits while 2031616 bits available", "> 248 KiB",
                                "bishengir-compile-a5")}


@pytest.mark.parametrize("family", list(ROTARY_PLANTED))
def test_planted_oversized_rotary_entry_is_ub_overflow(tmp_path, family):
    """A rotary entry too big for the unified buffer, planted under the family key, is listed by the
    op's own compile cases and fails with the compiler's message (A2: bishengir-compile; A5:
    bishengir-compile-a5)."""
    npu_compile, bishengir = _toolchain()
    soc, bits, kib, compiler = ROTARY_PLANTED[family]
    tables = {"rotary": {"archs": {family: [{"when": {"dtype": ["float16"]}, "config": {"ELEMENTS": 32768}}]}}}
    with planted_tables(tmp_path / "tables", "npu", tables):
        cases = collect_cases([soc], [OP])
    ub = [c for c in cases if c.dtype == "float16" and c.constants["BLOCK_R"] * c.constants["BLOCK_D"] == 32768
          and _layout(c).startswith("forward, head dim 128, prefill (B, H, S, D)") and "adjacent pairs" not in c.config]
    assert len(ub) == 1, "the planted entry was not collected"
    (r,) = npu_compile.run_cases(ub, 1, keep=tmp_path / "keep", bishengir=bishengir)
    assert r.soc == soc
    assert r.result == "ub-overflow" and kib in r.detail, r
    log = (Path(r.artifacts) / "bishengir.log").read_text()
    assert f"--target={soc}" in log and Path(log.split(" ", 1)[0]).name == compiler
    assert "error: ub overflow, requires " in log and bits in log
