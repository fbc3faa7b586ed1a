"""python -m xkernels.check: passes the real ops, catches deliberately wrong ones."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

import xkernels
from xkernels.cli import check
from xkernels.harness import accuracy, memory, resolve_target, tolerances
from xkernels.harness.cases import OPS, cases


class Override:
    """Register ``fn`` as the ``op`` implementation on ``backend`` for the block."""

    def __init__(self, op: str, backend: str, fn) -> None:
        impl = xkernels.OpImpl(op, backend, fn, priority=100, note="(deliberately wrong, test)")

        class Plugin:
            @xkernels.hookimpl
            def xkernels_add_op_impls(self):
                return [impl]

        self.plugin = Plugin()

    def __enter__(self):
        xkernels.registry.register(self.plugin)
        return self

    def __exit__(self, *exc) -> None:
        xkernels.registry.unregister(self.plugin)


def run(capsys, *argv: str) -> tuple[int, str]:
    rc = check.main(list(argv))
    return rc, capsys.readouterr().out


def summary(out: str) -> tuple[int, int, int]:
    m = re.search(r"^(\d+) cases: (\d+) passed, (\d+) failed", out, re.M)
    assert m, out
    return int(m[1]), int(m[2]), int(m[3])


@pytest.mark.parametrize("ops, dtypes", [("add,broadcast", "float16,bfloat16,float32,int32,int64"),
                                         ("matmul,linear", "float16,bfloat16,float32"),
                                         ("add_layer_norm,add_rms_norm", "float16,bfloat16,float32"),
                                         ("rotary_embedding", "float16,bfloat16,float32")])
def test_quick_interpreter_run_passes(capsys, ops, dtypes, tmp_path):
    import xkernels

    reason = xkernels.get_backend("interpreter").unavailable_reason()
    if reason:  # e.g. Triton 3.6 with numpy >= 2.4 on a GPU image; CI pins a working pair
        pytest.skip(reason)
    path = tmp_path / "check.json"
    rc, out = run(capsys, "--backend", "interpreter", "--quick", "--op", ops, "--dtype", dtypes, "--json", str(path))
    n, passed, failed = summary(out)
    assert (rc, failed) == (0, 0), out
    assert n == passed == len(cases(ops.split(","), None, ["quick"]))
    data = json.loads(path.read_text())
    assert data["header"]["backend"] == "interpreter" and len(data["results"]) == n
    assert all(r["passed"] and r["tolerance"] for r in data["results"])


def test_wrong_values_fail(capsys):
    def subtracts(x, y, *, alpha=1, out=None):
        return OPS["add"].torch_fn(x, y, alpha=-alpha, out=out)

    with Override("add", "cpu", subtracts):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "add", "--dtype", "float32")
    n, _, failed = summary(out)
    assert rc == 1 and failed > n // 2, out
    assert "outside tolerance" in out


@pytest.mark.parametrize("wrong, needle", [("y", "output 0: "), ("s", "output 1: "), ("tensor", "not 2 tensors")])
def test_fused_norm_outputs_are_each_checked(capsys, wrong, needle):
    """(y, s) of add_rms_norm: a wrong y, a wrong s, or y alone each fail the case."""
    def off(x, residual, weight=None, eps=1e-6, *, offset=0.0, return_sum=True):
        result = OPS["add_rms_norm"].torch_fn(x, residual, weight, eps, offset=offset, return_sum=return_sum)
        if not return_sum:
            return result if wrong != "y" else result * 1.001
        y, s = result
        return {"y": (y * 1.001, s), "s": (y, s * 1.001), "tensor": y}[wrong]

    with Override("add_rms_norm", "cpu", off):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "add_rms_norm", "--dtype", "float32")
    n, _, failed = summary(out)
    assert rc == 1 and failed >= n // 2, out
    assert needle in out


@pytest.mark.parametrize("wrong, needle", [("q", "output 0: "), ("k", "output 1: "), ("sign", "outside tolerance"),
                                           ("tensor", "not 2 tensors")])
def test_rotary_outputs_are_each_checked(capsys, wrong, needle):
    """(q_embed, k_embed) of rotary_embedding: the real op passes on the cpu backend (PyTorch's formula
    in the dtype); a wrong q_embed, a wrong k_embed, the rotation the other way (the backward's
    transposed rotation, -sin) or q_embed alone each fail the case."""
    rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "rotary_embedding")
    n, passed, failed = summary(out)
    assert (rc, failed) == (0, 0) and n == passed == len(cases(["rotary_embedding"], None, ["quick"])), out

    def off(q, k, cos, sin, unsqueeze_dim=1):
        qe, ke = OPS["rotary_embedding"].torch_fn(q, k, cos, -sin if wrong == "sign" else sin, unsqueeze_dim)
        return {"q": (qe * 1.001, ke), "k": (qe, ke * 1.001), "sign": (qe, ke), "tensor": qe}[wrong]

    with Override("rotary_embedding", "cpu", off):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "rotary_embedding", "--dtype", "float32")
    n, _, failed = summary(out)
    assert rc == 1 and failed >= n - 1, out  # the empty case has nothing to get wrong
    assert needle in out


def test_one_part_in_a_thousand_fails_float32(capsys):
    def slightly_off(x, y, *, alpha=1, out=None):
        r = torch.add(x, y, alpha=alpha) * (1 + 1e-4)
        return r if out is None else out.copy_(r)

    with Override("broadcast", "cpu", lambda x, bias, *, out=None: slightly_off(x, bias, out=out)):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "broadcast", "--dtype", "float32")
    assert rc == 1 and "outside tolerance" in out, out


def test_unwritten_out_fails(capsys):
    def forgets_out(x, bias, *, out=None):
        return out if out is not None else torch.add(x, bias)  # never writes out=

    with Override("broadcast", "cpu", forgets_out):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "broadcast", "--dtype", "float16,int32")
    assert rc == 1
    assert "elements still NaN" in out and "elements still sentinel" in out, out


def test_modified_input_fails(capsys):
    def clobbers(x, bias, *, out=None):
        r = torch.add(x, bias)
        if bias.numel():
            bias.view(-1)[0] += 1  # the result is right, the input is not
        return r if out is None else out.copy_(r)

    with Override("broadcast", "cpu", clobbers):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "broadcast", "--dtype", "float32")
    assert rc == 1 and "modified its input 'bias'" in out, out


def test_matmul_dropping_one_product_fails(capsys):
    def drops_last_k(a, b, *, out=None):
        r = torch.matmul(a[..., :-1], b[..., :-1, :]) if a.dim() == b.dim() == 2 and a.shape[-1] > 1 \
            else torch.matmul(a, b)
        return r if out is None else out.copy_(r)

    with Override("matmul", "cpu", drops_last_k):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "matmul", "--dtype", "float32,bfloat16")
    assert rc == 1
    failed = [line for line in out.splitlines() if line.rstrip().endswith("FAIL")]
    assert any("K=4097" in line for line in failed), out  # one product of 4097 is still caught


def test_crash_and_wrong_dtype_fail(capsys):
    def wrong_dtype(x, weight, bias=None, activation=None, **kw):
        return torch.nn.functional.linear(x.double(), weight.double())

    with Override("linear", "cpu", wrong_dtype):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "linear", "--dtype", "float32")
    assert rc == 1 and "PyTorch gives" in out, out

    with Override("linear", "cpu", lambda *a, **k: 1 / 0):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "linear", "--dtype", "float32")
    assert rc == 1 and "raised ZeroDivisionError" in out, out


def test_missing_op_fails_not_skips(capsys, monkeypatch):
    import xkernels.ops

    monkeypatch.delattr(xkernels.ops, "matmul")
    rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "matmul", "--dtype", "float32")
    _, passed, failed = summary(out)
    assert rc == 1 and passed == 0 and failed > 0
    assert "xkernels.ops.matmul is not implemented" in out


def test_fresh_seed_each_run_and_replay(capsys):
    seeds = []
    for _ in range(2):
        rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "add", "--dtype", "int64")
        assert rc == 0, out
        seeds.append(int(re.search(r"seed (\d+)", out)[1]))
    assert seeds[0] != seeds[1]
    case = cases(["add"], [torch.float32], ["quick"])[0]
    a, b = case.make_inputs("cpu", seeds[0]), case.make_inputs("cpu", seeds[0])
    assert torch.equal(a.args[0], b.args[0])


def test_check_case_reports_errors():
    target = resolve_target("cpu")
    case = next(c for c in cases(["matmul"], [torch.float32], ["quick"]) if c.layout == "2-D, K=4097")
    res = accuracy.check_case(case, target.backend, target.device, seed=1)
    assert res.passed and 0 < res.max_abs < 1e-2 and res.max_rel >= 0, res


@pytest.mark.parametrize("argv", [["--device", "npu"], ["--device", "tpu"], ["--backend", "no-such-backend"],
                                  ["--op", "conv"], ["--dtype", "float8"]])
def test_unusable_target_or_arguments_exit_2(capsys, argv):
    if argv == ["--device", "npu"] and xkernels.get_backend("npu").is_available():
        pytest.skip("an NPU is present here")
    rc = check.main([*argv, "--quick"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err


def test_compare_in_chunks_finds_the_first_bad_element(monkeypatch):
    monkeypatch.setattr(accuracy, "CHUNK", 7)
    ref = torch.arange(1, 31, dtype=torch.float32).reshape(5, 6)
    got = ref.clone()
    got[3, 2] += 1
    got[4, 5] = float("nan")
    tol = tolerances.ELEMENTWISE[torch.float32]
    c = accuracy.compare(got, ref, None, tol, 0.0)
    assert (c.bad, c.left, c.first_bad) == (2, 1, (20, 22.0, 21.0))
    assert math.isnan(c.max_abs) and math.isnan(c.max_rel)
    got[4, 5] = ref[4, 5]
    c = accuracy.compare(got, ref, None, tol, 0.0)
    assert (c.bad, c.left, c.max_abs) == (1, 0, 1.0) and c.max_rel == pytest.approx(1 / 21)
    assert accuracy.compare(ref, ref, None, tol, 0.0) == accuracy.Comparison()


def test_a_result_that_overflows_at_the_edge_of_its_dtypes_range_is_within_tolerance():
    """float16: an exact value just under 65520 rounds to 65504; a result computed a little larger
    (another accumulation order) overflows to inf. Compared with the exact value at the overflow
    threshold, that is within tolerance; an inf far from the range, or of the other sign, is not."""
    exact = torch.tensor([-65515.0, 65519.0, 3.0, -65515.0, 60000.0], dtype=torch.float64)
    ref = exact.to(torch.float16)
    assert ref[0] == -65504 and ref[1] == 65504
    got = torch.tensor([float("-inf"), float("inf"), 3.0, float("inf"), float("inf")], dtype=torch.float16)
    tol = tolerances.ELEMENTWISE[torch.float16]
    c = accuracy.compare(got, ref, None, tol, 0.0, exact=exact)
    assert (c.bad, c.first_bad[0]) == (2, 3)  # +inf for -65515, and +inf for 60000
    assert accuracy.compare(got[:3], ref[:3], None, tol, 0.0, exact=exact[:3]).bad == 0
    assert accuracy.compare(got[:3], ref[:3], None, tol, 0.0).bad == 2  # without the exact reference: as before
    assert accuracy._overflow_threshold(torch.float16) == 65520.0


def _summary_with_skips(out: str) -> tuple[int, int, int, int]:
    m = re.search(r"^(\d+) cases: (\d+) passed, (\d+) failed, (\d+) skipped", out, re.M)
    assert m, out
    return int(m[1]), int(m[2]), int(m[3]), int(m[4])


def test_cases_over_the_memory_budget_are_skipped_and_reported(capsys, tmp_path):
    """--max-memory: cases estimated above it are not run; the table, the summary and --json say
    which and why, and the exit code is 3 (nothing failed, something was not checked)."""
    path = tmp_path / "check.json"
    budget = 66 << 20
    rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "add", "--dtype", "float32",
                  "--max-memory", "66M", "--json", str(path))
    n, passed, failed, skipped = _summary_with_skips(out)
    selected = cases(["add"], [torch.float32], ["quick"])
    device = torch.device("cpu")
    too_big = [c for c in selected if memory.footprint(c, device, accuracy.CHUNK).host > budget]
    assert 0 < len(too_big) < len(selected)
    assert (rc, n, passed, failed, skipped) == (3, len(selected), n - len(too_big), 0, len(too_big)), out
    assert "skipped (not enough free memory" in out
    assert out.count("skipped: needs ~") == len(too_big) and "allowed 66.0 MiB (--max-memory)" in out
    data = json.loads(path.read_text())
    assert data["header"]["summary"] == {"cases": n, "passed": passed, "failed": 0, "skipped": skipped}
    assert data["header"]["memory"]["max_memory_bytes"] == budget and data["header"]["memory"]["host_free_bytes"] > 0
    gone = [r for r in data["results"] if r["skipped"]]
    assert {(r["shape"], r["layout"]) for r in gone} == {(c.shape_label, c.layout) for c in too_big}
    assert all(not r["passed"] and "needs ~" in r["message"] for r in gone)


def test_free_memory_decides_what_runs(capsys, monkeypatch):
    """Without --max-memory the host's free memory (less the margin) is the limit: the 1024^3
    float32 bias add that the OOM killer ended on a 24 GiB machine is skipped there, 8192^2 runs."""
    monkeypatch.setattr(memory, "host_free", lambda: (24 << 30, "test"))
    free = memory.free_memory(torch.device("cpu"))
    full = {c.id: c for c in cases(["add", "matmul"], [torch.float32], ["full"])}
    big = full["add/float32/y[N] (bias add)/1024x1024x1024 + 1024"]
    need = memory.footprint(big, torch.device("cpu"), accuracy.CHUNK)
    assert need.host > 24 << 30  # inputs, clones, result: 12 GiB; float64 input and reference: 16 GiB
    assert "85% of 24.00 GiB free" in memory.does_not_fit(need, free)
    square = memory.footprint(full["matmul/float32/square/8192x8192 @ 8192x8192"], torch.device("cpu"), accuracy.CHUNK)
    assert memory.does_not_fit(square, free) is None
    monkeypatch.setattr(memory, "host_free", lambda: (70 << 20, "test"))
    rc, out = run(capsys, "--device", "cpu", "--quick", "--op", "add", "--dtype", "int64")
    n, passed, failed, skipped = _summary_with_skips(out)
    assert rc == 3 and failed == 0 and skipped == n - passed > 0 and "85% of 70.0 MiB free" in out, out


def test_accelerator_cases_need_device_and_host_memory():
    case = next(c for c in cases(["add"], [torch.float32], ["full"]) if c.shape_label == "8192x8192 + 8192x8192")
    need = memory.footprint(case, torch.device("cuda"), accuracy.CHUNK)
    assert need.device >= 4 * (256 << 20)  # x, y, their clones (the result comes on top)
    assert need.host >= 2 * (512 << 20)  # float64 x and y for the reference
    assert memory.does_not_fit(need, memory.FreeMemory(1 << 40, 1 << 40, "test")) is None
    assert "on the device" in memory.does_not_fit(need, memory.FreeMemory(need.device, 1 << 40, "test"))
    assert "on the host" in memory.does_not_fit(need, memory.FreeMemory(1 << 40, need.host, "test"))
    assert memory.device_free(torch.device("cpu")) is None


@pytest.mark.parametrize("version, files", [
    ("v2", {"memory.max": "2147483648", "memory.current": "1073741824", "memory.stat": "inactive_file 268435456"}),
    ("v1", {"memory/memory.limit_in_bytes": "2147483648", "memory/memory.usage_in_bytes": "1073741824",
            "memory/memory.stat": "total_inactive_file 268435456"}),
])
def test_host_free_respects_a_cgroup_limit(monkeypatch, tmp_path, version, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    monkeypatch.setattr(memory, "_CGROUP", tmp_path)
    free, source = memory.host_free()
    assert (free, source) == ((1 << 30) + (1 << 28), "cgroup limit - usage")
    (tmp_path / next(iter(files))).write_text("max\n")  # unlimited: MemAvailable decides
    assert memory.host_free()[1] != "cgroup limit - usage"


def test_out_of_memory_in_the_harness_is_a_reported_skip(monkeypatch):
    """An allocation failure while building inputs or the reference skips that case with the
    error; the run goes on. Any other harness error is not swallowed."""
    target = resolve_target("cpu")
    picked = cases(["add"], [torch.float32], ["quick"])[:3]
    real = accuracy.reference

    def reference(op, inputs, dtype):
        if inputs.args[0].numel() == 7:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 7 bytes")
        return real(op, inputs, dtype)

    monkeypatch.setattr(accuracy, "reference", reference)
    results = accuracy.run_checks(picked, target.backend, target.device, seed=1)
    assert [r.skipped for r in results] == [True, False, False] and all(r.passed for r in results[1:])
    assert "ran out of memory building its inputs or reference (DefaultCPUAllocator" in results[0].message
    monkeypatch.setattr(accuracy, "reference", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        accuracy.run_checks(picked, target.backend, target.device, seed=1)


@pytest.mark.parametrize("text, size", [("66M", 66 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("4096", 4096),
                                        ("8kb", 8 << 10)])
def test_max_memory_sizes(text, size):
    assert check.parse_size(text) == size


def test_bad_max_memory_exits_2(capsys):
    assert check.main(["--quick", "--max-memory", "lots"]) == 2
    assert "--max-memory 'lots'" in capsys.readouterr().err
