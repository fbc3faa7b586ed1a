"""The native extension (``native.cpp``): the ops' native front door (``native_route.h``,
``ops/native_front_door.py``), ``enable()``'s C++ overrides, and autograd nodes of fused ops
that run without Python.

Why: a Python ``autograd.Function`` costs the host, per training call, its ``apply`` (context,
saved tensors, output bookkeeping) and a backward that takes the GIL on autograd's device thread
and calls ATen from Python op by op. For the fused add + LayerNorm of a launch-bound training
step that was ~100 µs more than PyTorch's add and LayerNorm on an H100 host
(results/2026-11-25-h100-backward-handoff). ``native.cpp`` records the same forward and
differentiates it in C++: the forward launches the kernel from a packed launch record and makes
the grad_fn itself; the backward launches the backward kernel and reduces with ATen, never
taking the GIL. The op's Python backward stays the fallback for everything the recorded
backward does not cover.

Build: on first use, with the C++ compiler that PyTorch's extensions use (``$CXX``, else
``c++``), against the running torch's headers and libraries (``torch.utils.cpp_extension``'s
paths; no ninja, no CUDA toolkit: the driver is opened at run time), into
``<cache root>/native/<torch version>-<python>-<source hash>/`` (``xkernels.cache``). A build takes
about a minute; it runs in a background thread (``module()`` returns ``None`` until it is ready,
and the Python paths run meanwhile: their results are the same) unless ``wait=True``. Where it
cannot be built (no compiler, no headers) one ``RuntimeWarning`` says why and the Python paths
stay. ``XKERNELS_NATIVE=0`` turns it off; ``XKERNELS_NATIVE=wait`` builds in the foreground.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

from xkernels.cache import cache_root

SOURCE = Path(__file__).with_name("native.cpp")
#: every file the build reads (native.cpp includes the headers), hashed into the cache path
SOURCES = (SOURCE, SOURCE.with_name("native_launch.h"), SOURCE.with_name("native_route.h"),
           SOURCE.with_name("native_overrides.h"), SOURCE.with_name("native_call.h"))
NAME = "xkernels_native"

_lock = threading.Lock()
_module: Any = None
_reason: str | None = None
_builder: threading.Thread | None = None
#: called with the module once it is loaded (layers above register here; this module imports none)
on_load: list[Any] = []
#: held while the extension is loaded; set under it at interpreter exit (``_stop_loading``)
_load_lock = threading.Lock()
_exiting = False


def _stop_loading() -> None:
    """At interpreter exit: a load in progress finishes first, and no build thread loads the
    extension afterwards. A daemon thread still inside the extension's C++ (its module init, the
    on_load listeners) when the interpreter finalizes is ended by ``pthread_exit``, whose
    unwinding through C++ aborts the process ("terminate called without an active exception").
    A thread still waiting on the compiler is in C only, and ends quietly."""
    global _exiting
    with _load_lock:
        _exiting = True


atexit.register(_stop_loading)


def setting() -> str:
    """``XKERNELS_NATIVE``: ``"0"`` (off), ``"wait"`` (build in the foreground), else on."""
    return os.environ.get("XKERNELS_NATIVE", "1").strip().lower()


def build_dir() -> Path:
    """Where this torch's build of this source lives."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()[:12]
    tag = f"{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}".replace("+", "_")
    return cache_root() / "native" / tag


def compile_command(out: Path) -> list[str]:
    """The compiler call that builds ``out`` from ``native.cpp`` against the running torch."""
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX") or "c++"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    libs = cpp_extension.library_paths()
    # a CUDA build of torch: enable()'s overrides call aten's CUDA kernels directly (at::cuda::)
    cuda = [] if torch.version.cuda is None or not any((Path(p) / "libtorch_cuda.so").exists() for p in libs) \
        else ["-DXK_ATEN_CUDA"]
    return [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-DTORCH_EXTENSION_NAME={NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H", f"-I{SOURCE.parent}", *includes,
            *cuda, str(SOURCE),
            *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs],
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", *(["-ltorch_cuda"] if cuda else []), "-o", str(out)]


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(NAME, path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _build() -> None:
    """Load the cached build, or compile it (then load); sets ``_module`` or ``_reason``."""
    global _module, _reason
    out = build_dir() / f"{NAME}.so"
    try:
        if not out.exists():
            cxx = os.environ.get("CXX") or "c++"
            if shutil.which(cxx) is None:
                raise RuntimeError(f"no C++ compiler ({cxx!r} is not on PATH)")
            out.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
            os.close(fd)
            try:
                done = subprocess.run(compile_command(Path(tmp)), capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"the compiler failed: {(done.stderr or done.stdout).strip()[-600:]}")
                os.replace(tmp, out)  # atomic: a concurrent build or reader sees all of it or nothing
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        with _load_lock:
            if _exiting:
                _reason = "the interpreter is exiting"
                return
            _module = _load(out)
            for listener in on_load:  # e.g. xkernels.dispatch: the use_backend blocks open already
                listener(_module)
    except Exception as exc:  # keep the Python paths, say why once
        _reason = f"{type(exc).__name__}: {exc}"[:800]
        warnings.warn(f"xkernels: the native extension ({SOURCE.name}) is unavailable, repeated op calls and the "
                      f"fused ops' training calls keep their Python paths: {_reason}", RuntimeWarning, stacklevel=3)


def module(wait: bool = False) -> Any:
    """The loaded extension, or ``None``: turned off, not built yet (a background build is started
    on the first call unless ``wait`` or ``XKERNELS_NATIVE=wait``), or unavailable
    (``unavailable_reason``)."""
    global _builder, _reason
    if _module is not None or _reason is not None:
        return _module
    how = setting()
    if how == "0":
        _reason = "XKERNELS_NATIVE=0"
        return None
    with _lock:
        if _module is not None or _reason is not None:
            return _module
        if wait or how == "wait":
            if _builder is not None:
                _builder.join()
            else:
                _build()
            return _module
        if _builder is None:
            _builder = threading.Thread(target=_build, name="xkernels-native-build", daemon=True)
            _builder.start()
    return None


def ready() -> Any:
    """The extension if it is loaded now; never starts a build (for per-call checks)."""
    return _module


def unavailable_reason() -> str | None:
    """Why there is no extension (after ``module(wait=True)``); ``None`` when it is loaded."""
    return _reason


def status() -> str:
    """One line for reports: loaded, building, off or why not."""
    if _module is not None:
        return "loaded"
    if _reason is not None:
        return f"unavailable ({_reason})"
    if _builder is not None and _builder.is_alive():
        return "building"
    return "not requested"


def launch_spec(launch: Any, backend_name: str) -> Any:
    """What native code launches with: a ``cuda_launch.Record``'s packed spec (no Python per
    launch), or on an interpreter backend (where every launch is Python anyway, so CI exercises
    the native paths) the launch function itself; ``None`` otherwise (Triton's own launcher: the
    GIL would be taken per launch, and nothing is gained)."""
    spec = getattr(launch, "spec", None)
    if callable(spec):
        return spec()
    return launch if callable(launch) and backend_name.startswith("interpreter") else None
