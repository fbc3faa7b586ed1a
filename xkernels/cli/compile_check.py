"""The list of kernel compilations that prove the npu tuning tables fit the hardware.

For every SoC of ``backends/npu_socs.json`` (Atlas A2, A3 and Ascend 950 / A5) and every op that
declares compile cases (``Op.compile_cases``, see ``xkernels.compile_cases``), each npu tuning
entry a call on that SoC can select, with each kernel dtype, epilogue and layout the entry
serves, becomes one :class:`CompileCase`. The op builds its cases with its own planning code (the
plan a real call makes: ``BinaryPlan``, ``MatmulPlan``, ``AddNormPlan``, ``GatedPlan``, with the
entry forced and the SoC's launch geometry), on ``meta`` tensors, so the signature and constexprs
are exactly what a device launch would compile, including Triton's specialization of integer
arguments equal to 1 (which changes the memory plan). This module gives the op the SoC: its
launch geometry and its table sections in ``xkernels.tuning.lookup``'s order; it names no op.
``python -m xkernels.npu_compile`` compiles the cases with triton-ascend and plans their memory
with bishengir-compile.

Which entries, for which calls: ``ops/elementwise/compile.py`` (add, broadcast),
``ops/matmul/compile.py`` (matmul, linear), ``ops/fused/add_norm_compile.py`` (add_layer_norm,
add_rms_norm) and ``ops/fused/gated_linear_compile.py`` (gated_linear) say. An op joins by
implementing ``compile_cases``; the modules under ``ops/fused/`` are imported here with the rest
of ``xkernels.ops``.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from xkernels.backends import npu as npu_backend
from xkernels.compile_cases import CompileCase, CompileTarget

__all__ = ["CompileCase", "collect", "collect_cases", "compile_ops", "default_socs"]


def default_socs() -> list[str]:
    """Every SoC of backends/npu_socs.json (the targets bishengir-compile and bishengir-compile-a5
    1.2.0 accept for A2, A3 and A5)."""
    return list(npu_backend.SOCS)


class _Geometry(npu_backend.NpuBackend):
    """The npu backend's rules for one SoC, from the SoC table's core counts (no device needed)."""

    def __init__(self, soc: str) -> None:
        self.soc = soc
        sheet = npu_backend.DATASHEET[soc]
        self.cores = (int(sheet["cube_cores"].value), int(sheet["vector_cores"].value))

    def max_programs(self, unit: Any = "vector", device: Any = None) -> int:
        return min(self.cores[0] if unit == "cube" else self.cores[1], npu_backend.MAX_GRID)

    def compute_units(self, device: Any = None) -> int:
        return self.cores[0]  # AI cores, as the backend's properties() reads them from the driver

    def arch(self, device: Any = None) -> str:
        return self.soc


def _sections(table: str, soc: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, table)`` in ``xkernels.tuning.lookup``'s order: tuning directories (plugins and
    the user's cache first), then the SoC's table keys, then ``default``."""
    from xkernels.dispatch import get_backend
    from xkernels.registry import registry

    for d in registry.tuning_dirs(get_backend("npu")):
        path = Path(d) / f"{table}.json"
        if path.exists():
            data = json.loads(path.read_text())
            for key in [*npu_backend.table_keys(soc), "default"]:
                yield f"{path.name} [{key}]", {"archs": data.get("archs", {}).get(key, []),
                                               "candidates": data.get("candidates", {}).get(key, [])}


def compile_ops() -> dict[str, Any]:
    """Every op that declares compile cases, by name, in the order the ops were made: the ops of
    ``xkernels.ops`` and of each module under ``xkernels.ops.fused``."""
    importlib.import_module("xkernels.ops")  # makes the ops
    from xkernels.ops.op import REGISTERED, Op

    try:
        fused = importlib.import_module("xkernels.ops.fused")
    except ImportError:
        fused = None
    if fused is not None and hasattr(fused, "__path__"):
        for mod in pkgutil.iter_modules(fused.__path__):
            importlib.import_module(f"{fused.__name__}.{mod.name}")
    return {name: op for name, op in REGISTERED.items() if type(op).compile_cases is not Op.compile_cases}


# --------------------------------------------------------------------------- all of it


def collect(socs: list[str] | None = None, ops: list[str] | None = None) -> tuple[list[CompileCase], list[str]]:
    """``(cases, notes)``: every compilation the npu tables imply on ``socs`` (default: every SoC of
    npu_socs.json) for ``ops`` (default: all), and a line for each entry not compiled and why."""
    unknown = [s for s in socs or () if s not in npu_backend.SOCS]
    if unknown:
        raise ValueError(f"unknown SoC {unknown}: backends/npu_socs.json lists {', '.join(npu_backend.SOCS)}")
    known = compile_ops()
    unknown_ops = [o for o in ops or () if o not in known]
    if unknown_ops:
        raise ValueError(f"unknown op {unknown_ops}: the ops with compile cases are {', '.join(known)}")
    cases: list[CompileCase] = []
    notes: list[str] = []
    for soc in socs or default_socs():
        target = CompileTarget(soc, _Geometry(soc), lambda table, soc=soc: list(_sections(table, soc)), notes)
        for name in ops or known:
            cases += known[name].compile_cases(target)
    return cases, notes


def collect_cases(socs: list[str] | None = None, ops: list[str] | None = None) -> list[CompileCase]:
    """Every (op, npu tuning entry, dtype, epilogue, layout, SoC) compilation the tables imply."""
    return collect(socs, ops)[0]
