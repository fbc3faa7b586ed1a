"""xkernels.tune and xkernels.sweep on the interpreter: planning, measuring (failures recorded,
checkpoints resumed), choosing rules, and a torchrun sweep equal to a single-process one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xkernels
from xkernels import sweep, tuning
from xkernels.cli import matmul_tables, tune
from xkernels.harness import Target
from xkernels.harness.cases import Case, T
from xkernels.harness.tolerances import tolerance
from xkernels.ops.matmul import config as mc

sys.path.insert(0, str(Path(__file__).parent))
from tune_fixed_timer import fixed_timer  # noqa: E402

pytestmark = pytest.mark.uses_interpreter

ROOT = Path(__file__).resolve().parents[2]
INTERP = "interpreter"


def _target() -> Target:
    return Target(xkernels.get_backend(INTERP), torch.device("cpu"))


def _row(case: str, dtype: str, numel: int, times: dict[str, float], torch_ms: float = 1.0) -> dict:
    return {"case": case, "dtype": dtype, "variant": "tiled", "numel": numel, "shape": [[numel // 8, 8], [8]],
            "torch_ms": torch_ms, "cfgs": [{"cfg": {"BLOCK_M": int(k)}, "ms": v} for k, v in times.items()]
            + [{"cfg": {"BLOCK_M": 99}, "err": "RuntimeError: does not compile"}]}


def test_elementwise_rule_is_the_config_with_the_smallest_worst_slowdown():
    # config 1 is fastest on one case and 3x slower on the other; config 2 is never more than 1.25x off
    rows = [_row("a", "bfloat16", 4096, {"1": 1.0, "2": 1.25}), _row("b", "bfloat16", 8192, {"1": 3.0, "2": 1.0})]
    rules = tune.elementwise_rules(rows)
    assert len(rules) == 1
    r = rules[0]
    assert r["config"] == {"BLOCK_M": 2}
    assert r["when"] == {"variant": "tiled", "dtype": ["bfloat16", "float16"], "numel_min": 0, "numel_max": 2**17}
    assert r["measured"]["shapes"] == [[[512, 8], [8]], [[1024, 8], [8]]]
    assert r["measured"]["worst_vs_best"] == 1.25 and r["measured"]["worst_ratio"] == 0.8
    rows.append(_row("c", "float16", 2**20, {"1": 1.0}))  # fp16 measured: bf16 rules stop serving it
    whens = [r["when"] for r in tune.elementwise_rules(rows)]
    assert [w["dtype"] for w in whens] == [["bfloat16"], ["float16"]] and whens[1]["numel_min"] == 2**17 + 1


def test_matmul_rules_split_classes_by_epilogue_and_record_measurements():
    a, b = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64}

    def row(m, act, ta, tb):
        return {"M": m, "N": 14336, "K": 4096, "act": act, "bias": False, "dtype": "bfloat16", "torch_ms": 1.0,
                "cfgs": [{"cfg": a, "ms": ta}, {"cfg": b, "ms": tb}]}

    rows = [row(1, "silu", 2.0, 1.0), row(128, "silu", 1.0, 2.0), row(1, None, 1.0, 2.0)]
    built = tune.matmul_rules(rows, units=4)["bfloat16"]
    assert built["dtypes"] == ["bfloat16", "float16"]
    got = [(r["when"], r["config"]) for r in built["rules"]]
    # silu's rules name it; the activation-free class follows unkeyed and catches every other epilogue
    assert got == [({"dtype": ["bfloat16", "float16"], "n": 14336, "k": 4096, "activation": "silu", "m_min": 1,
                     "m_max": 11}, b),
                   ({"dtype": ["bfloat16", "float16"], "n": 14336, "k": 4096, "activation": "silu", "m_min": 12}, a),
                   ({"dtype": ["bfloat16", "float16"], "n": 14336, "k": 4096, "m_min": 1}, a)]
    assert built["rules"][0]["measured"] == {"shapes": [[1, 14336, 4096]], "ms": 1.0, "torch_ms": 1.0,
                                             "worst_ratio": 1.0, "best_ms": 1.0}
    key = {"dtype": "float16", "m": 5, "n": 14336, "k": 4096, "activation": "silu", "bias": False}
    assert next(r["config"] for r in built["rules"] if tuning.matches(r["when"], key)) == b
    gelu = {**key, "activation": "gelu"}  # never measured: the activation-free class's rule
    assert next(r["config"] for r in built["rules"] if tuning.matches(r["when"], gelu)) == a
    # one epilogue per (N, K): activation-free rules do not name it; rules measured with an
    # activation only are for any activation (they say nothing of the bare GEMM's speed)
    assert "activation" not in matmul_tables.rules(rows[2:], ["bfloat16"])[0]["when"]
    assert matmul_tables.rules(rows[:2], ["bfloat16"])[0]["when"]["activation"] == matmul_tables.WITH_ACTIVATION


def test_plan_takes_candidates_from_the_tables():
    backend = xkernels.get_backend(INTERP)
    planned = sweep.plan("linear", backend, "models", [torch.bfloat16], ["llama3-8b"])
    assert len(planned) == 5 * 7
    table = json.loads((ROOT / "ops/tuning/interpreter/linear.json").read_text())
    assert [dict(c) for c in planned[0].configs] == table["candidates"]["default"][0]["configs"]
    assert any(c.get("SPLIT_K") for c in planned[0].configs)
    assert "linear.json [default] candidates" in planned[0].candidates_from
    add = sweep.plan("add", backend, "quick")
    assert [sweep.elementwise_variant(sc.case) for sc in add] == ["tiled", "flat"]
    assert all("BLOCK" in c for c in add[1].configs) and all("BLOCK_M" in c for c in add[0].configs)
    # the npu tables have no element-wise candidates: the built-in list, and the plan says so
    npu = sweep.plan("broadcast", xkernels.get_backend("interpreter-npu"), "quick")
    assert npu[0].candidates_from == "xkernels.sweep.ELEMENTWISE_CANDIDATES"
    with pytest.raises(ValueError, match="needs --shapes models"):
        sweep.plan("add", backend, "quick", models=["gpt2"])
    seed = sweep.plan("matmul", backend, "seed")
    assert {sc.case.shapes[0] for sc in seed} >= {(16, 4096), (4096, 256), (64, 4096)}


def test_cuda_tables_list_fp32_and_split_k_candidates():
    for op in ("matmul", "linear"):
        groups = json.loads((ROOT / f"ops/tuning/cuda/{op}.json").read_text())["candidates"]["sm90"]
        fp32 = [g for g in groups if g["when"]["dtype"] == ["float32"]]
        assert len(fp32) == 1 and {c.get("SPLIT_K", 1) for c in fp32[0]["configs"]} == {1, 2, 4, 8}
        half = [g for g in groups if "bfloat16" in g["when"]["dtype"]][0]["configs"]
        kernels, blas = [c for c in half if not c.get("VENDOR")], [c for c in half if c.get("VENDOR")]
        assert {c["BLOCK_M"] for c in kernels} >= {64, 128} and {c["BLOCK_N"] for c in kernels} >= {64, 128, 256}
        assert len(blas) == 1 and len(blas[0]["cost"]) == 4 and all(v >= 0 for v in blas[0]["cost"])


def test_assign_is_deterministic_balanced_and_complete():
    planned = sweep.plan("linear", xkernels.get_backend(INTERP), "models", [torch.float16])
    for n in (1, 2, 3):
        split = sweep.assign(planned, n)
        assert split == sweep.assign(planned, n)
        assert sorted(i for r in split for i in r) == list(range(len(planned)))
        loads = [sum(planned[i].cost() for i in r) for r in split]
        assert max(loads) <= 1.2 * sum(loads) / n


def _bias_case(rows: int = 8) -> Case:
    return Case("broadcast", (T((rows, 64), torch.float32), T((64,), torch.float32)), "bias[N]", frozenset({"quick"}))


def test_failures_and_inapplicable_configs_are_recorded_and_checkpoints_resume(tmp_path):
    good = {"BLOCK_M": 8, "BLOCK_N": 64}
    sc = sweep.SweepCase(_bias_case(), (good, {"BLOCK_M": 3, "BLOCK_N": 64}, {"BLOCK": 1024}), "test")
    ckpt = sweep.Checkpoint(tmp_path, "broadcast", 0, INTERP, "interpreter")
    calls = []

    def timer(fn, label):
        calls.append(label)
        return fixed_timer(fn, label)

    recs = sweep.measure_case(sc, _target(), timer, ckpt.load(), ckpt.append)
    assert [("torch_ms" in r, "ms" in r, "err" in r, "not_applicable" in r) for r in recs] == [
        (True, False, False, False), (False, True, False, False), (False, False, True, False),
        (False, False, False, True)]
    assert "BLOCK_M" in recs[2]["err"] or "power" in recs[2]["err"].lower() or recs[2]["err"]
    assert len(calls) == 2  # torch and the one good config
    row = sweep.rows([sc], {r["key"]: r for r in recs})[0]
    assert [c["cfg"] for c in row["cfgs"]] == [good, {"BLOCK_M": 3, "BLOCK_N": 64}]  # not applicable: left out
    with open(ckpt.path, "a") as f:
        f.write('{"key": "cut sho')  # a crash in the middle of a line
    calls.clear()
    again = sweep.measure_case(sc, _target(), timer, ckpt.load(), ckpt.append)
    assert calls == [] and [r["key"] for r in again] == [r["key"] for r in recs]
    other = sweep.Checkpoint(tmp_path, "broadcast", 1, "interpreter-npu", "Ascend910B3")
    assert other.load() == {}  # another backend's records are never reused


def test_a_wrong_result_fails_the_check():
    ref = torch.randn(4, 8, dtype=torch.float64)
    tol = tolerance("add", torch.float32, xkernels.get_backend(INTERP))
    sweep._check("add", ref.float(), ref, None, tol, 0.0)
    bad = ref.float().clone()
    bad[1, 2] += 1.0
    with pytest.raises(ValueError, match="1 of 32 elements"):
        sweep._check("add", bad, ref, None, tol, 0.0)
    nan = ref.float().clone()
    nan[0, 0] = float("nan")
    with pytest.raises(ValueError):
        sweep._check("add", nan, ref, None, tol, 0.0)


def _rules(path: Path) -> list:
    return json.loads(path.read_text())["archs"]["interpreter"]


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_torchrun_sweep_writes_the_rules_of_a_single_process_sweep(tmp_path):
    args = ["--backend", INTERP, "--op", "add", "--shapes", "quick"]
    assert tune.main([*args, "--out-dir", str(tmp_path / "one")], timer=fixed_timer) == 0
    single = json.loads((tmp_path / "one/add.json").read_text())
    assert single["sweep"]["world_size"] == 1 and single["sweep"]["items_per_rank"] == [5]
    proc = _torchrun([str(ROOT / "tests/cli/tune_fixed_timer.py"), *args, "--out-dir", str(tmp_path / "two")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((tmp_path / "two/add.json").read_text())
    assert two["sweep"]["world_size"] == 2 and sum(two["sweep"]["items_per_rank"]) == two["sweep"]["items"] == 5
    assert all(two["sweep"]["items_per_rank"]) and two["sweep"]["failed"] == []
    assert _rules(tmp_path / "two/add.json") == _rules(tmp_path / "one/add.json")
    assert sorted((tmp_path / "two/checkpoints").glob("add.rank*.jsonl")) == [
        tmp_path / "two/checkpoints/add.rank0.jsonl", tmp_path / "two/checkpoints/add.rank1.jsonl"]
    # a restart with the checkpoints measures nothing again and writes the same rules
    assert tune.main([*args, "--out-dir", str(tmp_path / "two")], timer=fixed_timer) == 0
    again = json.loads((tmp_path / "two/add.json").read_text())
    assert again["sweep"]["resumed"] == 5 and _rules(tmp_path / "two/add.json") == _rules(tmp_path / "one/add.json")


def test_restart_after_a_rank_stopped_measures_only_what_its_checkpoint_lacks(tmp_path):
    """A 2-process sweep whose rank 1 stopped mid-sweep (its checkpoint cut after two records, the
    next line half written): the same command again measures exactly the missing items, on the
    rank they belong to, and writes the rules of the uninterrupted sweep."""
    args = [str(ROOT / "tests/cli/tune_fixed_timer.py"), "--backend", INTERP, "--op", "add", "--shapes", "quick",
            "--out-dir", str(tmp_path)]
    assert _torchrun(args, tmp_path).returncode == 0
    full = _rules(tmp_path / "add.json")
    ckpt = tmp_path / "checkpoints/add.rank1.jsonl"
    lines = ckpt.read_text().splitlines()
    lost = [json.loads(line) for line in lines[2:]]
    lost_items = [r for r in lost if "cfg" in r]
    assert lost_items, lines  # rank 1 had items after its first two records
    ckpt.write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])
    kept0 = len((tmp_path / "checkpoints/add.rank0.jsonl").read_text().splitlines())
    proc = _torchrun(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((tmp_path / "add.json").read_text())["sweep"]
    assert again["measured"] == len(lost_items) and again["resumed"] == 5 - len(lost_items)
    assert [r["measured"] for r in again["ranks"]] == [0, len(lost_items)]
    # rank 0 appended nothing; rank 1 appended exactly the lost records (items and torch's)
    assert len((tmp_path / "checkpoints/add.rank0.jsonl").read_text().splitlines()) == kept0
    new = [json.loads(x) for x in ckpt.read_text().splitlines()[3:]]
    assert sorted(r["key"] for r in new) == sorted(r["key"] for r in lost)
    assert _rules(tmp_path / "add.json") == full


def _vendor_candidates(cache: Path) -> list[dict]:
    """A user-cache table for the interpreter whose linear candidates include the device's BLAS
    (``{"VENDOR": true}``), as the cuda tables' do: a sweep then measures the vendor route."""
    configs = [{"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8},
               {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, {"VENDOR": True}]
    d = cache / "tuning" / INTERP
    d.mkdir(parents=True)
    (d / "linear.json").write_text(json.dumps({"op": "linear", "backend": INTERP, "source": "a test", "archs": {},
                                               "candidates": {"default": [{"when": {}, "configs": configs}]}}))
    return configs


def test_a_sweep_with_vendor_records_writes_the_same_tables_in_one_and_two_processes(tmp_path, monkeypatch):
    """The vendor-BLAS candidate is measured like the others (its route checked against PyTorch)
    and fitted as the vendor candidate, never as a kernel: one process and two (gloo) build the
    tables, and choose the same rules and candidates from the same measurements."""
    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(tmp_path / "cache"))
    configs = _vendor_candidates(tmp_path / "cache")
    args = ["--backend", INTERP, "--op", "linear", "--shapes", "quick"]
    assert tune.main([*args, "--out-dir", str(tmp_path / "one")], timer=fixed_timer) == 0
    proc = _torchrun([str(ROOT / "tests/cli/tune_fixed_timer.py"), *args, "--out-dir", str(tmp_path / "two")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = (json.loads((tmp_path / d / "linear.json").read_text()) for d in ("one", "two"))
    assert one["sweep"]["items"] == two["sweep"]["items"] == 3 * len(configs)
    assert one["sweep"]["failed"] == two["sweep"]["failed"] == []
    assert two["sweep"]["world_size"] == 2 and all(two["sweep"]["items_per_rank"])
    rows = [json.loads(x) for x in (tmp_path / "two/linear.measurements.jsonl").read_text().splitlines()]
    assert all(any(c["cfg"] == {"VENDOR": True} and c["ms"] > 0 for c in r["cfgs"]) for r in rows)
    assert one["archs"] == two["archs"] and one["candidates"] == two["candidates"]
    fitted = one["candidates"]["interpreter"][0]["configs"]
    assert [c for c in fitted if c.get("VENDOR")] == [c for c in fitted if "BLOCK_M" not in c]
    assert len([c for c in fitted if c.get("VENDOR")]) == 1 and all(len(c["cost"]) == 3 for c in fitted if "BLOCK_M" in c)
    # the same measurements, fed to the table builder in rank order or reversed: the same table
    again = tune.table("linear", xkernels.get_backend(INTERP), list(reversed(rows)), one["source"])
    assert again["archs"] == one["archs"] and again["candidates"] == one["candidates"]
    # per-rank timing breakdown
    for r in two["sweep"]["ranks"]:
        assert r["wall_s"] > 0 and r["first_call_s"] > 0 and r["timing_s"] > 0 and r["compiles"] == 0
    assert two["sweep"]["ranks"][0]["tables_s"] > 0 and "where the time went" in proc.stdout


def test_torchrun_module_command_with_the_device_timer(tmp_path):
    proc = _torchrun(["-m", "xkernels.tune", "--backend", INTERP, "--op", "add", "--shapes", "quick", "--reps", "2",
                      "--out-dir", str(tmp_path)], ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = json.loads((tmp_path / "add.json").read_text())
    assert t["sweep"]["world_size"] == 2 and t["sweep"]["items"] == 5
    assert {r["when"]["variant"] for r in t["archs"]["interpreter"]} == {"flat", "tiled"}
    assert all(r["measured"]["ms"][0] > 0 for r in t["archs"]["interpreter"])
    assert "100%" in proc.stderr  # rank 0's progress bar reached the end
    rows = [json.loads(line) for line in (tmp_path / "add.measurements.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["cfgs"]) in (2, 3) for r in rows)


def test_linear_sweep_writes_joint_rules_and_fitted_candidates(tmp_path):
    assert tune.main(["--backend", INTERP, "--op", "linear", "--shapes", "quick", "--out-dir", str(tmp_path)],
                     timer=fixed_timer) == 0
    t = json.loads((tmp_path / "linear.json").read_text())
    rules = t["archs"]["interpreter"]
    assert {(r["when"]["n"], r["when"]["k"]) for r in rules} == {(32, 64), (32, 32)}
    assert all(r["when"]["dtype"] == ["float32"] and r["measured"]["shapes"] for r in rules)
    assert t["sweep"]["items"] == 12 and t["sweep"]["failed"] == []
    fitted = t["candidates"]["interpreter"][0]["configs"]
    assert fitted and all(len(c["cost"]) == 3 for c in fitted)


@pytest.mark.parametrize("confirmed,vendor", [(None, True), (1.02, False), (0.9, True)],
                         ids=["single pass", "loss not confirmed", "loss confirmed"])
def test_tables_act_on_a_loss_only_as_confirmed(confirmed, vendor):
    """A best config 10% slower than torch in one pass routes its class to the BLAS; where the
    interleaved re-measurement of that config says otherwise, the re-measurement decides."""
    a = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}
    row = {"M": 333, "N": 5120, "K": 13824, "act": None, "bias": True, "dtype": "bfloat16", "torch_ms": 1.0,
           "cfgs": [{"cfg": a, "ms": 1.1}]}
    if confirmed is not None:
        row["confirmed"] = {"cfg": a, "ms": [1.0, confirmed], "ratio": confirmed, "spread": [0.98, 1.03], "rounds": 7}
    (rule,) = matmul_tables.rules(matmul_tables.merge([{**row, "op": "linear"}], "linear"), ["bfloat16"])
    assert bool(rule["config"].get("VENDOR")) == vendor
    if confirmed is not None:
        assert rule["measured"]["confirmed"] == {"ratio": confirmed, "spread": [0.98, 1.03], "rounds": 7}
        if not vendor:
            assert rule["measured"]["worst_ratio"] == confirmed


def test_a_losing_case_is_re_measured_in_interleaved_rounds(tmp_path):
    case = Case("linear", (T((8, 32), torch.float32), T((16, 32), torch.float32), T((16,), torch.float32)),
                "bias", frozenset({"quick"}))
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32}
    sc = sweep.SweepCase(case, (cfg,), "test")
    ckpt = sweep.Checkpoint(tmp_path, "linear", 0, INTERP, "interpreter")
    calls = []

    def timer(fn, label):  # the kernel loses by 20% in one pass
        calls.append(label["who"])
        fn()
        return 1.0 if label["who"] == "torch" else 1.2

    recs = sweep.measure_case(sc, _target(), timer, ckpt.load(), ckpt.append,
                              confirm_loss=sweep.confirm_for(_target(), timer, rounds=3))
    assert calls == ["torch", "xkernels"] + ["xkernels", "torch"] * 3
    conf = recs[-1]
    assert conf["key"] == f"confirm|{sc.id}" and conf["cfg"] == cfg and conf["rounds"] == 3
    assert conf["ratio"] == pytest.approx(1 / 1.2) and conf["ms"] == pytest.approx([1.2, 1.0])
    row = sweep.rows([sc], {r["key"]: r for r in recs})[0]
    assert row["confirmed"]["ratio"] == pytest.approx(1 / 1.2)
    calls.clear()  # resumed from the checkpoint: nothing re-measured
    again = sweep.measure_case(sc, _target(), timer, ckpt.load(), ckpt.append,
                               confirm_loss=sweep.confirm_for(_target(), timer, rounds=3))
    assert calls == [] and [r["key"] for r in again] == [r["key"] for r in recs]


FIXTURE = Path(__file__).parent / "data/linear-bert-h100-with-vendor.jsonl"


def test_tables_from_h100_measurements_with_vendor_records(tmp_path):
    """BERT-base linear rows measured on an H100 (bf16; kernel configs and torch's time from
    results/2026-11-22-h100-gemm-calibration/calib.jsonl, the vendor route's time from torch
    measured again on the same shape, results/2026-11-22-h100-gemm-calibration-seeds/calib2.jsonl):
    the ``{"VENDOR": true}`` records are fitted with
    torch's times as the device's BLAS, never as a kernel (they have no tiles), and never win a
    rule as a kernel; rows split over ranks in any order build the same table."""
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    assert all(sum(c["cfg"] == {"VENDOR": True} for c in r["cfgs"]) == 1 for r in rows)
    built = tune.matmul_rules(rows, units=132)["bfloat16"]
    fitted = built["candidates"][0]["configs"]
    vendor = [c for c in fitted if c.get("VENDOR")]
    assert len(vendor) == 1 and len(vendor[0]["cost"]) == 4
    assert all("BLOCK_M" in c and len(c["cost"]) == 3 for c in fitted if not c.get("VENDOR"))
    blas = [(mc.Shape(r["M"], r["N"], r["K"], 1, 2, True), bool(r["act"]), ms) for r in rows
            for ms in [r["torch_ms"]] + [c["ms"] for c in r["cfgs"] if c["cfg"].get("VENDOR")]]
    assert vendor[0]["cost"] == [float(f"{v:.4g}") for v in mc.fit_vendor_cost(blas)]
    for rule in built["rules"]:
        row = next(r for r in rows if [r["M"], r["N"], r["K"]] == rule["measured"]["shapes"][0])
        kernels = [c["ms"] for c in row["cfgs"] if not c["cfg"].get("VENDOR")]
        pointer = [c["ms"] for c in row["cfgs"] if "BLOCK_M" in c["cfg"] and not c["cfg"].get("TMA")]
        if rule["config"] == {"VENDOR": True}:  # only where the best kernel is over 3% slower than torch
            assert min(kernels) > row["torch_ms"] * matmul_tables.VENDOR_MARGIN
        else:  # a TMA rule is the fastest kernel; the pointer rule after it the fastest pointer kernel
            fastest = min(kernels) if rule["when"].get("variant") == "tma" else min(pointer)
            assert "BLOCK_M" in rule["config"] and rule["measured"]["ms"] == round(fastest, 5)
    assert {json.dumps(r["config"]) for r in built["rules"]} > {json.dumps({"VENDOR": True})}
    shuffled = rows[1::2] + rows[::2]  # what rank 0 gathers from two ranks
    assert tune.matmul_rules(shuffled, units=132) == tune.matmul_rules(rows, units=132)
    with pytest.raises(ValueError, match="fit_vendor_cost"):
        mc.fit_cost([(mc.Shape(8, 8, 8, 1, 2, True), 1.0)] * 3, {"VENDOR": True}, 132)
    # the offline command over the same file installs the same rules
    table = tmp_path / "linear.json"
    table.write_text(json.dumps({"op": "linear", "backend": "cuda", "archs": {}}))
    assert matmul_tables.main([str(FIXTURE), "--arch", "sm90", "--units", "132", "--source", "test", "--install",
                               str(tmp_path), "--op", "linear"]) == 0
    installed = json.loads(table.read_text())
    assert installed["archs"]["sm90"] == matmul_tables.build(matmul_tables.merge(rows, "linear"), 132)["rules"]


def test_ranks_measure_a_case_s_configs_in_staggered_orders():
    """Rank r of n starts r/n of the way into a case's configs (so that ranks sharing a Triton
    cache do not compile the same kernels at once); the records come back in config order."""
    cfgs = tuple({"BLOCK_M": m, "BLOCK_N": 64} for m in (1, 2, 4, 8))
    assert sweep.rotated(cfgs, 0, 2) == list(cfgs) and sweep.rotated(cfgs, 1, 2) == [*cfgs[2:], *cfgs[:2]]
    assert sweep.rotated(cfgs, 2, 3) == [*cfgs[2:], *cfgs[:2]] and sweep.rotated((), 1, 2) == []
    sc = sweep.SweepCase(_bias_case(), cfgs, "test")
    seen = []

    def timer(fn, label):
        seen.append(label.get("cfg"))
        return fixed_timer(fn, label)

    recs = sweep.measure_case(sc, _target(), timer, {}, lambda r: r, order=(1, 2))
    assert seen == [None, *cfgs[2:], *cfgs[:2]]
    assert [r["cfg"] for r in recs[1:]] == list(cfgs) and all("ms" in r for r in recs[1:])
