"""The offline Ascend compile chain for one case: triton-ascend's frontend, then bishengir-compile's
memory planning, no CANN, no device (:mod:`xkernels.cli.npu_compile` runs it over many cases).

1. :func:`compile_ttadapter` compiles the ``@triton.jit`` kernel with **triton-ascend** for
   ``GPUTarget("npu", soc, 0)`` down to ``<kernel>.ttadapter`` (the linalg/HIVM IR triton-ascend
   hands to its NPU compiler); for an A5 SoC (Ascend 950) with the options triton-ascend's A5
   build defaults to (:data:`FRONTEND_OPTIONS_A5`: ``compile_on_910_95``). Without CANN,
   ``triton.compile`` then stops at the binary stage; the ``.ttadapter`` is already in the case's
   private ``TRITON_CACHE_DIR`` by then;
2. :func:`plan_memory` runs **bishengir-compile** (PyPI ``ascendnpu-ir``; ``bishengir-compile-a5``
   for A5) on it with the options triton-ascend uses at run time, plus ``--target=<soc>``. It
   tiles, plans the Unified Buffer (UB), L0C ("cc") and L1 ("cbuf") memory, and finally calls
   CANN's ``hivmc`` (``hivmc-a5``), which is not here: reaching that call means the memory plan
   passed. For A5 a stand-in ``hivmc-a5`` (:data:`HIVMC_A5_STUB`) takes the call, keeps the
   planned module and reports success, as the real one would, so the pipeline runs once instead
   of retrying;
3. :func:`classify_plan` turns the compiler's output into one of :data:`RESULTS`, and
   :func:`run_case` does 1 to 3 for one case, never raising, into a :class:`Result`. A frontend
   that crashed (an LLVM stack dump, not a diagnostic) runs once more; a case that compiles then
   says so in its detail (:data:`FRONTEND_CRASHED_ONCE`), a second crash is its ``frontend-error``.

:func:`check_environment` says whether triton-ascend and bishengir-compile are here (one line
naming what to install when not). triton-ascend is imported only when a case runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = ("ok", "ub-overflow", "cc-overflow", "frontend-error", "plan-error")

INSTALL_HINT = (
    "pip install torch==2.13.0 triton-ascend==3.2.0 pybind11 ascendnpu-ir==1.2.0 "
    "(in a virtual environment of its own: triton-ascend replaces the `triton` package)"
)

#: bishengir-compile options, as triton-ascend 3.2 passes them for Atlas A2/A3 parts
#: (linalg_to_bin_enable_npu_compile_A2_A3 with its default NPUOptions), less --target.
BISHENGIR_FLAGS = (
    "--enable-auto-multi-buffer=True",
    "--enable-auto-bind-sub-block=True",
    "--enable-hfusion-compile=true",
    "--enable-hivm-compile=true",
    "--enable-triton-kernel-compile=true",
)

#: bishengir-compile-a5 options, as triton-ascend 3.2's compile_on_910_95 path passes them
#: (linalg_to_bin_enable_npu_compile_910_95 with the NPUOptions defaults of its A5 build:
#: multibuffer and enable_auto_bind_sub_block are ``not is_compile_on_910_95``), less --target.
#: It adds the hfusion/triton-kernel switches only to a compiler named ``bishengir-compile``,
#: which is what an A5 CANN puts on $PATH; there is no --enable-hivm-compile on this path.
BISHENGIR_FLAGS_A5 = (
    "--enable-auto-multi-buffer=False",
    "--enable-auto-bind-sub-block=False",
    "--enable-hfusion-compile=true",
    "--enable-triton-kernel-compile=true",
)

#: triton.compile options that put triton-ascend 3.2 (built for A2/A3, ``is_compile_on_910_95 =
#: False``) on its A5 path: the NPUOptions defaults of an A5 build.
FRONTEND_OPTIONS_A5 = {"compile_on_910_95": True, "multibuffer": False, "enable_auto_bind_sub_block": False,
                       "enable_select_analysis": True}

#: The stand-in for CANN's hivmc-a5, put first on $PATH of each A5 plan: bishengir-compile-a5
#: calls it with the planned module once memory planning has passed. It keeps that module and
#: answers success (without it, the missing hivmc-a5 makes the compiler retry its whole pipeline
#: five times and print no sign of where it stopped).
HIVMC_A5_STUB = """#!/bin/sh
cp "$1" "$XKERNELS_PLANNED_MODULE" 2>/dev/null
echo "xkernels stand-in hivmc-a5: planned module received"
exit 0
"""
_PASSED_MARK_A5 = "xkernels stand-in hivmc-a5: planned module received"

#: Seconds one bishengir-compile run may take before the case is a plan-error.
PLAN_TIMEOUT_S = 600

# bishengir-compile prints these; see docs/npu-offline-compile.md for full samples.
_OVERFLOW_RE = re.compile(r"error: (\w+) overflow, requires (\d+) bits while (\d+) bits available")
_PASSED_MARK = "External hivmc run fails"  # the plan passed; the CANN binary step is missing
_RETRY_OK_RE = re.compile(
    r"\[NOTE\] Due to (\w+) overflow, automatically set (.*?); compilation then succeeded")
_ERROR_RE = re.compile(r"error: (.*)")


@dataclass(frozen=True)
class Result:
    """The outcome of one case. ``result`` is one of :data:`RESULTS`."""

    op: str
    dtype: str
    config: str
    soc: str
    result: str
    seconds: float
    detail: str = ""
    frontend_s: float = 0.0
    plan_s: float = 0.0
    artifacts: str = ""  # the directory kept for this case (--keep), else ""
    same_as: str = ""  # "op dtype config soc" of the compilation whose result this reuses

    @property
    def ok(self) -> bool:
        return self.result == "ok"


# --------------------------------------------------------------------------- environment


def toolchain(soc: str) -> str:
    """``"a5"`` or ``"a2a3"`` (npu_socs.json's family of ``soc``; an unlisted name by its form)."""
    from xkernels.backends.npu import soc_toolchain

    return soc_toolchain(soc)


def find_bishengir(chain: str = "a2a3") -> str | None:
    """Path of bishengir-compile (``chain="a5"``: bishengir-compile-a5): $XKERNELS_BISHENGIR
    ($XKERNELS_BISHENGIR_A5), the ascendnpu-ir package's bin/, or $PATH."""
    name = "bishengir-compile-a5" if chain == "a5" else "bishengir-compile"
    env = os.environ.get("XKERNELS_BISHENGIR_A5" if chain == "a5" else "XKERNELS_BISHENGIR")
    if env:
        return env if os.access(env, os.X_OK) else None
    try:
        import importlib.util

        spec = importlib.util.find_spec("ascendnpuir")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            cand = Path(loc) / "bin" / name
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    return shutil.which(name)


def triton_ascend_problem() -> str | None:
    """``None`` when the importable ``triton`` is triton-ascend, else what is wrong, in words."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            version("triton-ascend")
        except PackageNotFoundError:
            return "triton-ascend is not installed"
        import triton  # noqa: F401
        from triton.backends.ascend.compiler import AscendBackend  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except Exception as exc:  # e.g. pybind11 missing, or CUDA triton shadowing it
        return f"triton-ascend does not import ({type(exc).__name__}: {exc})"
    return None


def check_environment() -> tuple[str | None, str | None]:
    """``(bishengir path, None)`` when all is there, else ``(None, one-line problem)``."""
    problem = triton_ascend_problem()
    if problem:
        return None, f"{problem}: {INSTALL_HINT}"
    bisheng = find_bishengir()
    if not bisheng:
        where = " at $XKERNELS_BISHENGIR" if os.environ.get("XKERNELS_BISHENGIR") else ""
        return None, f"bishengir-compile not found{where}: pip install ascendnpu-ir==1.2.0"
    return bisheng, None


def _a5_compiler(bishengir: str) -> str | None:
    """bishengir-compile-a5 beside ``bishengir`` (the ascendnpu-ir wheel ships both), else found."""
    beside = Path(bishengir).with_name("bishengir-compile-a5")
    if not os.environ.get("XKERNELS_BISHENGIR_A5") and beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return find_bishengir("a5")


# --------------------------------------------------------------------------- one case


def _unwrap_kernel(kernel: Any) -> Any:
    """The JITFunction under triton.autotune / triton.heuristics wrappers."""
    seen = 0
    while not hasattr(kernel, "arg_names") and hasattr(kernel, "fn") and seen < 8:
        kernel = kernel.fn
        seen += 1
    return kernel


def _full_signature(kernel: Any, signature: dict[str, str], constants: dict[str, Any]) -> dict[str, str]:
    """The signature in the kernel's argument order; raises ValueError on a mismatch."""
    names = list(kernel.arg_names)
    missing = [n for n in names if n not in signature and n not in constants]
    extra = [n for n in signature if n not in names]
    if missing or extra:
        raise ValueError(f"signature mismatch: missing {missing}, unknown {extra}")
    constexprs = [p.name for p in kernel.params if p.is_constexpr]
    no_value = [n for n in constexprs if n not in constants]
    if no_value:
        raise ValueError(f"no value for constexpr {no_value}")
    return {n: signature.get(n, "constexpr") for n in names}


def _attrs(kernel: Any, signature: dict[str, str]) -> Any:
    """Pointer arguments divisible by 16, as torch's allocations are at launch time."""
    try:
        from triton.backends.ascend.compiler import AscendAttrsDescriptor

        hints = {i: 16 for i, n in enumerate(kernel.arg_names) if signature[n].startswith("*")}
        return AscendAttrsDescriptor.from_hints(hints)
    except Exception:
        return None


@contextlib.contextmanager
def _fds_to(path: Path):
    """Send file descriptors 1 and 2 (and sys.stdout/err) to ``path`` for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f, open(path, "a", buffering=1) as text:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("///")]
    lines = [ln for ln in lines if not ln.startswith("[INFO]")]
    return lines[-1] if lines else text.strip()


def compile_ttadapter(case: Any, workdir: Path) -> tuple[Path | None, str]:
    """Run triton-ascend on one case; ``(path of the .ttadapter or None, error detail)``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = _unwrap_kernel(case.kernel)
    constants = dict(case.constants)
    try:
        signature = _full_signature(kernel, dict(case.signature), constants)
    except (ValueError, AttributeError) as exc:
        return None, str(exc)
    cache = workdir / "triton-cache"
    cache.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "ASCEND_HOME_PATH")}
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    os.environ.pop("ASCEND_HOME_PATH", None)  # stop before the binary stage even where CANN exists
    error = ""
    try:
        with _fds_to(workdir / "frontend.log"):
            src = ASTSource(fn=kernel, signature=signature, constants=constants,
                            attrs=_attrs(kernel, signature))
            options = FRONTEND_OPTIONS_A5 if toolchain(case.soc) == "a5" else {}
            try:
                triton.compile(src, target=GPUTarget("npu", case.soc, 0), options=dict(options))
            except Exception as exc:  # expected: the binary stage needs CANN
                error = f"{type(exc).__name__}: {_last_line(str(exc))}"
                with open(workdir / "frontend.log", "a") as f:
                    f.write(f"\n{type(exc).__name__}: {exc}\n")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    found = sorted(cache.glob("*/*.ttadapter"))
    if not found:
        return None, error or "no .ttadapter produced"
    return found[0], ""


def classify_plan(returncode: int, output: str, produced: bool) -> tuple[str, str]:
    """Map bishengir-compile's exit and output to ``(result, detail)``."""
    overflows: dict[str, str] = {}
    for kind, need, have in _OVERFLOW_RE.findall(output):
        kind = kind.lower()
        overflows.setdefault(kind, f"{kind} needs {int(need) // 8192} KiB > {int(have) // 8192} KiB")
    if overflows:
        # An accumulator that does not fit L0C is the root cause when both are reported.
        order = {"cc": 0, "ub": 1}
        detail = "; ".join(overflows[k] for k in sorted(overflows, key=lambda k: (order.get(k, 2), k)))
        if "cc" in overflows:
            return "cc-overflow", detail
        if "ub" in overflows:
            return "ub-overflow", detail
        return "plan-error", detail.replace("cbuf needs", "cbuf (L1) needs")
    if _PASSED_MARK in output or _PASSED_MARK_A5 in output or (returncode == 0 and produced):
        r = _RETRY_OK_RE.search(output)
        if r:
            dropped = r.group(2).replace("set ", "").replace(" to false", "=false")
            return "ok", f"{r.group(1).lower()} overflow at first; passed with {dropped}"
        return "ok", ""
    errors = [e.strip() for e in _ERROR_RE.findall(output) if "Failed to run" not in e]
    if errors:
        return "plan-error", errors[-1][:200]
    return "plan-error", _last_line(output)[:200] or f"exit {returncode}"


def plan_memory(ttadapter: Path, soc: str, bishengir: str, workdir: Path) -> tuple[str, str]:
    """Run bishengir-compile on a .ttadapter for ``soc``; ``(result, detail)``. For an A5 SoC,
    ``bishengir`` is bishengir-compile-a5 and the planned module is kept as ``planned.hivm.mlir``."""
    # triton-ascend drops the mix_mode attribute before it calls bishengir-compile; do the same.
    text = re.sub(r', mix_mode\s*=\s*"[^"]*"', "", ttadapter.read_text())
    src = workdir / "kernel.ttadapter.mlir"
    src.write_text(text)
    out = workdir / "kernel.o"
    a5 = toolchain(soc) == "a5"
    cmd = [bishengir, str(src), f"--target={soc}", *(BISHENGIR_FLAGS_A5 if a5 else BISHENGIR_FLAGS), "-o", str(out)]
    env = dict(os.environ)
    env.pop("ASCEND_HOME_PATH", None)
    if a5:
        stub = workdir / "stub-bin" / "hivmc-a5"
        stub.parent.mkdir(exist_ok=True)
        stub.write_text(HIVMC_A5_STUB)
        stub.chmod(0o755)
        env["PATH"] = f"{stub.parent}{os.pathsep}{env.get('PATH', '')}"
        env["XKERNELS_PLANNED_MODULE"] = str(workdir / "planned.hivm.mlir")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PLAN_TIMEOUT_S,
                              cwd=workdir, env=env)
    except subprocess.TimeoutExpired:
        return "plan-error", f"bishengir-compile ran over {PLAN_TIMEOUT_S} s"
    output = proc.stdout + proc.stderr
    (workdir / "bishengir.log").write_text(" ".join(cmd) + "\n\n" + output)
    return classify_plan(proc.returncode, output, out.exists() or Path(str(out) + ".o").exists())


def _slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", "-".join(parts))[:150]


#: an LLVM crash's stack dump in the frontend's error (``#39 0x000055a9884c22ae (.../triton-adapter-opt+...)``)
_CRASH = re.compile(r"#\d+ 0x[0-9a-f]+ \(")
#: the detail of a case whose frontend crashed once and compiled when run again (triton-ascend's
#: ``triton-adapter-opt`` has crashed so, rarely, on a case it compiles every other time)
FRONTEND_CRASHED_ONCE = "the frontend crashed once (a stack dump) and compiled when run again"


def _frontend(case: Any, workdir: Path) -> tuple[Path | None, str]:
    try:
        return compile_ttadapter(case, workdir)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def run_case(case: Any, bishengir: str, keep: str | os.PathLike | None = None) -> Result:
    """Compile one case and plan its memory; never raises."""
    t0 = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="xk-npu-"))
    kept = ""
    fe_s = plan_s = 0.0
    try:
        ttadapter, err = _frontend(case, workdir)
        crashed = ttadapter is None and _CRASH.search(err) is not None
        if crashed:  # the frontend process crashed (a stack dump), not a diagnostic: once more, said
            ttadapter, err = _frontend(case, Path(tempfile.mkdtemp(prefix="xk-npu-", dir=workdir)))
        fe_s = time.perf_counter() - t0
        if ttadapter is None:
            result, detail = "frontend-error", err
        else:
            t1 = time.perf_counter()
            compiler = _a5_compiler(bishengir) if toolchain(case.soc) == "a5" else bishengir
            try:
                if compiler is None:
                    raise FileNotFoundError("bishengir-compile-a5 not found: pip install ascendnpu-ir==1.2.0")
                result, detail = plan_memory(ttadapter, case.soc, compiler, workdir)
            except Exception as exc:
                result, detail = "plan-error", f"{type(exc).__name__}: {exc}"
            plan_s = time.perf_counter() - t1
            if crashed:
                detail = "; ".join(d for d in (detail, FRONTEND_CRASHED_ONCE) if d)
        if keep:
            key = repr((sorted(case.signature.items()), sorted((k, repr(v)) for k, v in case.constants.items())))
            digest = hashlib.sha1(key.encode()).hexdigest()[:8]
            dest = Path(keep) / _slug(case.op, case.dtype, case.soc, case.config, digest)
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(workdir, dest)
            kept = str(dest)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return Result(op=case.op, dtype=case.dtype, config=case.config, soc=case.soc, result=result,
                  seconds=round(time.perf_counter() - t0, 3), detail=detail,
                  frontend_s=round(fe_s, 3), plan_s=round(plan_s, 3), artifacts=kept)


# --------------------------------------------------------------------------- many cases
