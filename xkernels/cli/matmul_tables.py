"""Matmul/linear tuning tables from measurements: measured rules per shape class plus candidates
with fitted costs for the wave model (see ``xkernels.ops.matmul.config``).

    python -m xkernels.cli.matmul_tables RUN1.jsonl [RUN2.jsonl ...] --arch sm90 --units 132 \\
        --source "..." --install ops/tuning/cuda --op linear,matmul

A measurement file has one JSON object per line and shape: ``{"op", "M", "N", "K", "act", "bias",
"torch_ms", "cfgs": [{"cfg": {...}, "ms": ...} | {"cfg": {...}, "err": "..."}]}`` (what
``python -m xkernels.tune`` writes; a row without ``"op"`` is linear's, as the first sweeps wrote
them). Rows of the same op, shape and epilogue from several files are merged: each config's time is
the **median** of all its measurements (so one glitched timing that a later run re-measured does not
decide anything), torch's likewise. Each op's tables are built from its own rows only (matmul's B is
row-major, linear's K-contiguous: one op's winners are not the other's). From them:

* **rules**: per measured (N, K) and M class, the fastest config, as a rule over
  ``n`` = N, ``k`` = K and the M range between the geometric midpoints of its measured
  neighbours. An (N, K) measured with one epilogue gives rules for any epilogue; one measured with
  several gives rules keyed by ``activation`` (and ``bias``) for all but the activation-free one,
  which follows them unkeyed. A TMA winner is followed by the fastest pointer-kernel config of the
  same class (for calls that cannot take TMA). Where even the fastest config is more than
  ``--vendor-margin`` (default 3%) slower than torch on the device's own BLAS, the rule is
  ``{"VENDOR": true}`` instead: calls of that class run the PyTorch call (``explain()`` says so), so
  no measured class is slower than torch by more than the front door's cost. Each rule records the
  shapes it was measured on, its time, torch's and the ratio (and, for vendor rules, the best
  kernel's ratio).
* **candidates**: every config that ran on at least three shapes, with a fitted
  ``"cost": [a, b, c]`` (``matmul_config.fit_cost``), so shapes no rule covers get the config of
  the smallest estimated time. Configs whose measurements the fit cannot explain (any shape more
  than 2.5x slower than fitted) are left out of the candidates: the model could not predict them.
  Torch's times are fitted too (``{"VENDOR": true, "cost": ...}``, ``matmul_config.vendor_ms``):
  the model picks a kernel only when it is estimated 1.1x faster than the device's BLAS.

A measured ``{"VENDOR": true}`` config (the tables' vendor candidate, which a sweep measures like
the others: the front door's BLAS route, checked against PyTorch) is never a kernel: it has no
tiles, so it is neither a rule's winner nor fitted with :func:`fit_cost`. Its times are the
device's BLAS measured once more and join torch's in the vendor fit, as ``matmul_config`` uses
that candidate (its cost is ``vendor_ms``'s, not the wave model's). Vendor rules still compare
the best kernel with torch's own time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from xkernels.ops.matmul.config import Shape, fit_cost, fit_vendor_cost, fitted_ms
from xkernels.ops.matmul.plan import ACTIVATIONS

#: what a rule measured only with activations is keyed to: any activation, never none (the
#: baseline of an activation-free call is the bare GEMM, which such a measurement says nothing of)
WITH_ACTIVATION = [a for a in ACTIVATIONS if a]

HALF = ["bfloat16", "float16"]
VENDOR_MARGIN = 1.03
UNPREDICTABLE = 2.5


def _key(cfg: dict[str, Any]) -> str:
    return json.dumps(cfg, sort_keys=True)


def _m_ranges(ms: list[int]) -> dict[int, tuple[int, int | None]]:
    """M -> (m_min, m_max) between the geometric midpoints of the measured Ms (open above)."""
    ms = sorted(set(ms))
    out = {}
    for i, m in enumerate(ms):
        lo = 1 if i == 0 else math.floor(math.sqrt(ms[i - 1] * m)) + 1
        hi = None if i == len(ms) - 1 else math.floor(math.sqrt(m * ms[i + 1]))
        out[m] = (lo, hi)
    return out


def is_vendor(cfg: dict[str, Any]) -> bool:
    """Whether a measured config is the device's BLAS route (``{"VENDOR": true}``), not a kernel."""
    return bool(cfg.get("VENDOR"))


def kernel_cfgs(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The kernel configs of a measurement row that ran (not failed, not the BLAS route)."""
    return [c for c in r["cfgs"] if "ms" in c and not is_vendor(c["cfg"])]


def _epilogue(r: dict[str, Any]) -> tuple[str, bool | None]:
    """(activation, bias) of a measurement row (bias ``None`` where the row does not say)."""
    return r.get("act") or "none", r.get("bias")


def rules(rows: list[dict[str, Any]], dtypes: list[str], vendor_margin: float = VENDOR_MARGIN) -> list[dict[str, Any]]:
    """Measured rules, one (or a TMA + pointer pair) per measured shape class. An (N, K) measured
    with several epilogues (Llama's gate with silu, up without) gets rules naming ``activation``
    (and ``bias``) in ``when`` for all but one (the activation-free one where measured), which
    follows them without an epilogue key. One measured only with activations gets rules for any
    activation: an activation-free call of that shape is left to the wave model and the BLAS."""
    by_nk: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        by_nk.setdefault((r["N"], r["K"]), []).append(r)
    out = []
    for (n, k), nk_group in sorted(by_nk.items()):
        epilogues = sorted({_epilogue(r) for r in nk_group}, key=lambda e: (e[0] == "none", str(e)))
        for i, (act, bias) in enumerate(epilogues):
            group = [r for r in nk_group if _epilogue(r) == (act, bias)]
            extra: dict[str, Any] = {}
            if i < len(epilogues) - 1:  # keyed; the last one catches every other epilogue
                extra["activation"] = act
                if bias is not None and len({b for _, b in epilogues}) > 1:
                    extra["bias"] = bias
            elif act != "none":  # measured with activations only: no claim about the bare GEMM
                extra["activation"] = WITH_ACTIVATION
            out += _class_rules(group, dtypes, n, k, extra, vendor_margin)
    return out


def _class_rules(group: list[dict[str, Any]], dtypes: list[str], n: int, k: int, extra: dict[str, Any],
                 vendor_margin: float) -> list[dict[str, Any]]:
    """The rules of one (N, K, epilogue) class: per measured M, over the M range around it."""
    out = []
    ranges = _m_ranges([r["M"] for r in group])
    for r in sorted(group, key=lambda r: r["M"]):
        ok = kernel_cfgs(r)
        if not ok:
            continue
        best = min(ok, key=lambda c: (c["ms"], _key(c["cfg"])))
        pointer = min((c for c in ok if not c["cfg"].get("TMA")), key=lambda c: (c["ms"], _key(c["cfg"])), default=None)
        lo, hi = ranges[r["M"]]
        when: dict[str, Any] = {"dtype": dtypes, "n": n, "k": k, **extra, "m_min": lo}
        if hi is not None:
            when["m_max"] = hi
        shape = [r["M"], r["N"], r["K"]]

        def measured(c: dict[str, Any]) -> dict[str, Any]:
            rec = {"shapes": [shape], "ms": round(c["ms"], 5), "torch_ms": round(r["torch_ms"], 5),
                   "worst_ratio": round(r["torch_ms"] / c["ms"], 3), "best_ms": round(best["ms"], 5)}
            conf = r.get("confirmed")
            if conf is not None and conf.get("cfg") == c["cfg"]:
                rec.update(worst_ratio=round(conf["ratio"], 3), confirmed=_confirmed(conf))
            return rec

        # a loss counts only as confirmed: the interleaved re-measurement of the best config against
        # torch (sweep.measure_case) decides where there is one
        conf = r.get("confirmed")
        confirmed = conf is not None and conf.get("cfg") == best["cfg"]
        ratio = conf["ratio"] if confirmed else r["torch_ms"] / best["ms"]
        if vendor_margin and ratio * vendor_margin < 1.0:
            out.append({"when": when, "config": {"VENDOR": True},
                        "measured": {"shapes": [shape], "ms": round(r["torch_ms"], 5),
                                     "torch_ms": round(r["torch_ms"], 5), "worst_ratio": 1.0,
                                     "best_kernel_ratio": round(ratio, 3),
                                     **({"confirmed": _confirmed(conf)} if confirmed else {})}})
            continue
        if best["cfg"].get("TMA"):
            out.append({"when": {"variant": "tma", **when}, "config": best["cfg"], "measured": measured(best)})
        if pointer is not None:
            out.append({"when": when, "config": pointer["cfg"], "measured": measured(pointer)})
    return out


def _confirmed(conf: dict[str, Any]) -> dict[str, Any]:
    """A confirmation's record in a rule: torch / kernel per interleaved round, median and spread."""
    return {"ratio": round(conf["ratio"], 3), "spread": [round(v, 3) for v in conf["spread"]],
            "rounds": conf["rounds"]}


def candidates(rows: list[dict[str, Any]], dtypes: list[str], units: int) -> list[dict[str, Any]]:
    """Candidate groups with fitted costs (see the module doc), the device's BLAS among them as
    ``{"VENDOR": true, "cost": ...}`` fitted on the rows' torch times and their measured
    ``{"VENDOR": true}`` configs (the BLAS route), which are never fitted as kernels."""
    points: dict[str, list[tuple[Shape, float]]] = {}
    cfgs: dict[str, dict[str, Any]] = {}
    blas: list[tuple[Shape, bool, float]] = []
    for r in rows:
        shape = Shape(r["M"], r["N"], r["K"], 1, 2, True)
        blas.append((shape, bool(r.get("act")), r["torch_ms"]))
        blas += [(shape, bool(r.get("act")), c["ms"]) for c in r["cfgs"] if "ms" in c and is_vendor(c["cfg"])]
        for c in kernel_cfgs(r):
            k = _key(c["cfg"])
            cfgs[k] = c["cfg"]
            points.setdefault(k, []).append((shape, c["ms"]))
    fitted = []
    for k, pts in sorted(points.items()):
        cost = fit_cost(pts, cfgs[k], units)
        if cost is None:
            continue
        worst = max(ms / max(fitted_ms(cost, cfgs[k], s, units), 1e-9) for s, ms in pts)
        if worst > UNPREDICTABLE:
            continue
        fitted.append({**cfgs[k], "cost": [float(f"{v:.4g}") for v in cost]})
    vendor = fit_vendor_cost(blas)
    if vendor is not None:
        fitted.append({"VENDOR": True, "cost": [float(f"{v:.4g}") for v in vendor]})
    return [{"when": {"dtype": dtypes}, "configs": fitted}]


def merge(rows: list[dict[str, Any]], op: str, untagged: str = "linear") -> list[dict[str, Any]]:
    """``op``'s rows, one per shape and epilogue, config times merged by median. Rows without an
    ``"op"`` (the first sweeps wrote none; they timed linear) count as ``untagged``'s."""
    shapes: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        if r.get("op", untagged) != op:
            continue
        key = (r["M"], r["N"], r["K"], r.get("act"), r.get("bias"))
        m = shapes.setdefault(key, {"M": r["M"], "N": r["N"], "K": r["K"], "act": r.get("act"),
                                    "bias": r.get("bias"), "torch": [], "times": {}, "cfg": {}, "err": {}})
        if r.get("confirmed"):  # a loss re-measured in interleaved rounds: the latest counts
            m["confirmed"] = r["confirmed"]
        if "torch_ms" in r:
            m["torch"].append(r["torch_ms"])
        for c in r.get("cfgs", ()):
            k = _key(c["cfg"])
            m["cfg"][k] = c["cfg"]
            if "ms" in c:
                m["times"].setdefault(k, []).append(c["ms"])
            else:
                m["err"][k] = c.get("err", "failed")
    out = []
    for m in shapes.values():
        if not m["torch"]:
            continue  # re-measurements of configs only: merged into the shape's own row
        cfgs = [{"cfg": m["cfg"][k], "ms": statistics.median(t)} for k, t in m["times"].items()]
        cfgs += [{"cfg": m["cfg"][k], "err": e} for k, e in m["err"].items() if k not in m["times"]]
        out.append({"op": op, "M": m["M"], "N": m["N"], "K": m["K"], "act": m["act"], "bias": m["bias"],
                    "torch_ms": statistics.median(m["torch"]), "cfgs": cfgs,
                    **({"confirmed": m["confirmed"]} if "confirmed" in m else {})})
    return sorted(out, key=lambda r: (r["N"], r["K"], r["M"], r["act"] or ""))


def build(rows: list[dict[str, Any]], units: int, dtypes: list[str] = HALF,
          vendor_margin: float = VENDOR_MARGIN) -> dict[str, Any]:
    """Rules and fitted candidates of ``rows``. The rows are taken in one canonical order (shape,
    epilogue), their configs too, so the same measurements give the same table whatever order
    they were gathered in (ranks, files): the fits' sums are then added up in the same order."""
    rows = [{**r, "cfgs": sorted(r["cfgs"], key=lambda c: _key(c["cfg"]))}
            for r in sorted(rows, key=lambda r: (r["N"], r["K"], r["M"], str(r.get("act")), str(r.get("bias"))))]
    return {"rules": rules(rows, dtypes, vendor_margin), "candidates": candidates(rows, dtypes, units)}


def install(path: Path, arch: str, built: dict[str, Any], source: str, dtypes: list[str]) -> None:
    """Replace ``arch``'s rules for ``dtypes`` (other dtypes' rules stay, after the new ones) and
    its candidate groups for them in the table at ``path``."""
    table = json.loads(path.read_text())
    kept = [r for r in table["archs"].get(arch, []) if not set(r.get("when", {}).get("dtype", [])) & set(dtypes)]
    table["archs"][arch] = built["rules"] + kept
    cands = table.setdefault("candidates", {})
    cands[arch] = built["candidates"] + [g for g in cands.get(arch, [])
                                         if not set(g.get("when", {}).get("dtype", [])) & set(dtypes)]
    table["source"] = source
    path.write_text(json.dumps(table, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m xkernels.cli.matmul_tables", description=__doc__.split("\n")[0])
    p.add_argument("measurements", type=Path, nargs="+")
    p.add_argument("--arch", required=True)
    p.add_argument("--units", type=int, required=True, help="compute units (SMs) of the measured device")
    p.add_argument("--source", required=True, help="the table's source line (device, date, versions, command)")
    p.add_argument("--install", type=Path, required=True, metavar="TABLE_DIR")
    p.add_argument("--op", default="linear,matmul")
    p.add_argument("--vendor-margin", type=float, default=VENDOR_MARGIN,
                   help="route a class to the device's BLAS when the best kernel is slower than torch by more "
                        "than this factor (0: kernels only)")
    a = p.parse_args(argv)
    rows = [json.loads(line) for f in a.measurements for line in f.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "cfgs" in r]
    for op in a.op.split(","):
        merged = merge(rows, op)
        if not merged:
            print(f"{op}: no measurements, table left as it is")
            continue
        built = build(merged, a.units, HALF, a.vendor_margin)
        install(a.install / f"{op}.json", a.arch, built, a.source, HALF)
        vendor = sum(1 for r in built["rules"] if r["config"].get("VENDOR"))
        print(f"{op}: {len(merged)} shapes -> {len(built['rules'])} rules ({vendor} to the vendor BLAS), "
              f"{len(built['candidates'][0]['configs'])} candidates with fitted costs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
