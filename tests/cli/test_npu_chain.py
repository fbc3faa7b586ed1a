"""``xkernels/cli/npu_chain.py``'s handling of a frontend that crashes (no triton-ascend needed:
the frontend and the planner are stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace

from xkernels.cli import npu_chain

CRASH = "MLIRCompilationError: #39 0x000055a9884c22ae (/x/triton/backends/ascend/triton-adapter-opt+0x92c2ae)"
CASE = SimpleNamespace(op="op", dtype="bfloat16", config="cfg", soc="Ascend910B1", signature={}, constants={})


def _run(monkeypatch, frontend_errors: list[str]) -> tuple[npu_chain.Result, int]:
    """run_case with a frontend giving each of ``frontend_errors`` in turn, then a module; and how
    many times the frontend ran."""
    calls = []

    def frontend(case, workdir):
        calls.append(workdir)
        if len(calls) <= len(frontend_errors):
            return None, frontend_errors[len(calls) - 1]
        module = workdir / "k.ttadapter"
        module.write_text("")
        return module, ""

    monkeypatch.setattr(npu_chain, "compile_ttadapter", frontend)
    monkeypatch.setattr(npu_chain, "plan_memory", lambda *a: ("ok", ""))
    monkeypatch.setattr(npu_chain, "toolchain", lambda soc: "a2")
    return npu_chain.run_case(CASE, "bishengir-compile"), len(calls)


def test_a_crash_is_run_again_and_said(monkeypatch):
    r, calls = _run(monkeypatch, [CRASH])
    assert (r.result, calls) == ("ok", 2) and npu_chain.FRONTEND_CRASHED_ONCE in r.detail


def test_a_second_crash_or_a_diagnostic_is_an_error(monkeypatch):
    r, calls = _run(monkeypatch, [CRASH, CRASH])
    assert (r.result, calls, r.detail) == ("frontend-error", 2, CRASH)
    r, calls = _run(monkeypatch, ["CompilationError: at 3:4: unsupported"])  # the frontend rejected it: not run again
    assert (r.result, calls) == ("frontend-error", 1)
