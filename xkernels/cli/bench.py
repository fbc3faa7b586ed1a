"""``python -m xkernels.bench``: xkernels against PyTorch on one device, with roofline context.

    python -m xkernels.bench [--device D] [--backend NAME] [--op OP] [--dtype DT]
                             [--size small|medium|large|models|all] [--model M] [--fast] [--seed N]
                             [--json PATH] [--csv PATH] [--plot PATH] [--compare OLD.json]
    python -m xkernels.bench --model NAME[,NAME]|all | --model-config CONFIG.json[,...] [--layers N]
                             [--mode eager,cudagraph,compile] [--way W] [--config base|tiny] [--batch B]
                             [--seq S] [--dtype DT] [--rounds R] [--fast] [--json PATH] [--csv PATH]
    python -m xkernels.bench --host [--device cuda|cpu] [--rounds R] [--calls N]

Defaults: the best device present; sizes ``all`` on an accelerator, ``small`` on the CPU;
float16, bfloat16, float32. ``--size models``: the real-model shape corpus
(``xkernels.harness.models``), ``--model`` narrowing it to some models. ``--fast``: the smallest
case per op and dtype, few repetitions, no cache flush (a smoke run; use it with the interpreter
backends). Exit codes: 0 done, 1 some case
raised, 2 the device is not usable here (one line on stderr says why) or bad arguments.

The header says what the ratio measures: on the cpu backend both sides are PyTorch (the ratio is
xkernels' front-door overhead), on the interpreter backends the kernels run in Triton's
interpreter. "% peak" is left blank ("-") where the ceiling does not bound the case
(``perf.peak_misleads``; the JSON row says why).
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import importlib.util
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from xkernels.cli.check import split_list
from xkernels.harness import Target, TargetUnavailable, perf, resolve_target
from xkernels.harness.cases import BENCH_SIZES, FLOAT_DTYPES, OP_NAMES, Case, cases, parse_dtype
from xkernels.harness.heldout import SIZE_TAG as HELDOUT
from xkernels.harness.model_zoo import model_names as whole_models
from xkernels.harness.models import SIZE_TAG as MODELS
from xkernels.harness.models import model_names

COLUMNS = (("op", 9), ("dtype", 8), ("shape", 22), ("layout", 18), ("ms", 9), ("p20-p80", 17),
           ("torch ms", 9), ("speedup", 7), ("confirmed", 9),
           ("spread", 9), ("band", 8), ("GB/s", 8), ("TFLOP/s", 8), ("% peak", 6),
           ("bound", 7), ("host us", 8), ("torch host us", 8))
KEY = ("op", "dtype", "shape", "layout")
SAME = 0.05  # --compare: changes within 5% are "same"


def _row(cells: Sequence[str]) -> str:
    return "  ".join(f"{c:<{w}}" for c, (_, w) in zip(cells, COLUMNS)).rstrip()


def _g(v: float | None, digits: int = 4) -> str:
    if v is None or math.isnan(v):
        return "-"
    return f"{v:.0f}" if abs(v) >= 10 ** (digits - 1) else f"{v:.{digits}g}"


def format_row(r: dict[str, Any]) -> str:
    if "error" in r:
        return _row([r["op"], r["dtype"], r["shape"], r["layout"], "ERROR"]) + f"  {r['error']}"
    return _row([r["op"], r["dtype"], r["shape"], r["layout"], _g(r["time_ms"]),
                 f"{_g(r['p20_ms'], 3)}-{_g(r['p80_ms'], 3)}", _g(r["torch_time_ms"]), f"{r['speedup']:.2f}x",
                 "-" if r.get("confirmed") is None else f"{r['confirmed']:.2f}x",
                 "-" if r.get("spread") is None else f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f}",
                 r["band"], _g(r["gbps"], 3), _g(r["tflops"], 3),
                 "-" if r["pct_of_peak"] is None else f"{r['pct_of_peak']:.0f}%", r["bound"],
                 _g(None if r["host_ms"] is None else r["host_ms"] * 1e3, 3),
                 _g(None if r.get("torch_host_ms") is None else r["torch_host_ms"] * 1e3, 3)])


def select_cases(ops: list[str], dtypes: list[torch.dtype] | None, sizes: list[str], fast: bool,
                 models: list[str] | None = None) -> list[Case]:
    """Benchmark cases; with ``fast`` only the smallest per op and dtype; ``models``: only corpus
    cases of these models."""
    picked = cases(ops, dtypes or list(FLOAT_DTYPES), sizes, models)
    if not fast:
        return picked
    smallest: dict[tuple[str, torch.dtype], Case] = {}
    for c in picked:
        size = sum(math.prod(s) for s in c.shapes if isinstance(s, tuple))
        best = smallest.get((c.op, c.dtype))
        if best is None or size < sum(math.prod(s) for s in best.shapes if isinstance(s, tuple)):
            smallest[(c.op, c.dtype)] = c
    return [c for c in picked if smallest[(c.op, c.dtype)] is c]


_version = perf.package_version


def what_is_measured(target: Target) -> str:
    """What the speedup column compares, for this backend."""
    b = target.backend
    if not b.runs_triton:
        return (f"the {b.name} backend runs PyTorch: the ratio measures xkernels' front-door overhead "
                f"(checks, dispatch) over calling PyTorch directly, not a kernel")
    if target.device.type == "cpu":
        return (f"the {b.name} backend runs the Triton kernels in Triton's interpreter on the CPU: "
                f"times measure the interpreter, not a kernel's speed")
    return f"xkernels' Triton kernels on {b.name} against PyTorch on the same inputs"


def peak_rule(target: Target, ceil: perf.Ceilings) -> str:
    """When the % peak column is filled in, for this device."""
    if target.device.type != "cpu":
        return "every case (a cache flush before each timed call)"
    cache = f"{ceil.cache_bytes >> 20} MiB" if ceil.cache_bytes else f"{perf.DEFAULT_CACHE_BYTES >> 20} MiB (assumed)"
    return (f"memory-bound cases with a working set >= {perf.CACHE_FACTOR}x the {cache} last-level cache, and "
            f"bf16 compute-bound cases; '-' elsewhere (the ceiling does not bound them)")


def header(target: Target, ceil: perf.Ceilings, fast: bool, seed: int) -> dict[str, Any]:
    def fig(f: Any) -> dict[str, Any]:
        return {"value": f.value, "unit": f.unit, "source": f.source, "note": f.note}

    return {"device_name": ceil.device_name, "device": str(target.device), "backend": target.backend.name,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
            "triton": _version("triton") or _version("triton-ascend"), "python": platform.python_version(),
            "host": platform.node(), "platform": platform.platform(), "fast": fast, "seed": seed,
            "measures": what_is_measured(target), "pct_of_peak_shown_for": peak_rule(target, ceil),
            "copy_bandwidth": fig(ceil.copy_bandwidth), "matmul_peak": fig(ceil.matmul_peak),
            "datasheet": {k: fig(v) for k, v in ceil.datasheet.items()}}


def print_header(h: dict[str, Any], ceil: perf.Ceilings) -> None:
    print(f"xkernels.bench: backend {h['backend']!r} on {h['device']} ({h['device_name']}), torch {h['torch']}, "
          f"triton {h['triton']}, {h['date']}")
    sheet = "; ".join(f"{k} {v}" for k, v in ceil.datasheet.items()) or "none known"
    print(f"  copy bandwidth {ceil.copy_bandwidth}")
    print(f"  matmul peak    {ceil.matmul_peak}")
    print(f"  datasheet      {sheet}")
    print(f"  speedup        {h['measures']}")
    print(f"  % peak         {h['pct_of_peak_shown_for']}")
    print(_row([name for name, _ in COLUMNS]))


def compare(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """Lines saying, per row present in both runs, how much faster or slower it got."""
    before = {tuple(r[k] for k in KEY): r for r in old if "time_ms" in r}
    lines, counts = [], {"faster": 0, "slower": 0, "same": 0}
    for r in new:
        o = before.get(tuple(r[k] for k in KEY))
        if o is None or "time_ms" not in r:
            continue
        ratio = o["time_ms"] / r["time_ms"]
        verdict = "faster" if ratio > 1 + SAME else "slower" if ratio < 1 / (1 + SAME) else "same"
        counts[verdict] += 1
        lines.append(f"  {r['op']:<9}  {r['dtype']:<8}  {r['shape']:<22}  {r['layout']:<18}  "
                     f"{_g(o['time_ms'])} -> {_g(r['time_ms'])} ms  {ratio:.2f}x {verdict}")
    matched = sum(counts.values())
    lines.append(f"  {matched} matching rows: {counts['faster']} faster, {counts['slower']} slower, "
                 f"{counts['same']} same (within {SAME:.0%}); {len(new) - matched} new rows unmatched")
    return lines


def plot_roofline(rows: list[dict[str, Any]], ceil: perf.Ceilings, path: str) -> None:
    """A log-log roofline PNG: achieved FLOP/s against arithmetic intensity, xkernels and torch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "time_ms" in r and r["flops"]]
    bw, peak = ceil.copy_bandwidth.value * 1e9, ceil.matmul_peak.value * 1e12
    lo = min([r["intensity"] for r in ok] + [0.1]) / 2
    hi = max([r["intensity"] for r in ok] + [ceil.ridge * 4]) * 2
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.loglog(xs, [min(peak, bw * x) / 1e12 for x in xs], "k-", label="roof (measured copy bw, bf16 peak)")
    for who, key, marker in (("xkernels", "time_ms", "o"), ("torch", "torch_time_ms", "x")):
        ax.scatter([r["intensity"] for r in ok], [r["flops"] / (r[key] * 1e-3) / 1e12 for r in ok],
                   marker=marker, label=who)
    for r in ok:
        ax.annotate(f"{r['op']} {r['dtype']} {r['shape']}", (r["intensity"], r["flops"] / (r["time_ms"] * 1e-3) / 1e12),
                    fontsize=6)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"xkernels roofline: {ceil.device_name}")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_csv(rows: list[dict[str, Any]], path: str) -> None:
    fields = sorted({k for r in rows for k in r}, key=lambda k: (k not in KEY, k))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            cfg = r.get("config") or {}
            w.writerow({**r, "config": ";".join(f"{k}={v}" for k, v in cfg.items())})


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m xkernels.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", help="torch device type: cuda, npu, cpu (default: best present)")
    p.add_argument("--backend", help="force an xkernels backend, e.g. interpreter, interpreter-npu")
    p.add_argument("--op", action="append", help=f"op(s), repeat or comma-separate: {', '.join(OP_NAMES)}")
    p.add_argument("--dtype", action="append", help="dtype(s): float16, bfloat16, float32 (int32, int64 for add)")
    p.add_argument("--size", choices=(*BENCH_SIZES, MODELS, HELDOUT, "all"),
                   help="size class (default: all; small on cpu); models: the real-model shape corpus; heldout: "
                        "layers of model families outside it at odd token counts (xkernels/harness/heldout.json)")
    p.add_argument("--model", action="append",
                   help="with --size models: only the corpus cases of these models "
                        f"({', '.join(model_names())}); without --size: whole transformers models "
                        f"({', '.join(whole_models())}, or all) timed four ways: torch, enable(), patch(), both "
                        "(docs/models.md)")
    p.add_argument("--model-config", metavar="CONFIG.json", action="append",
                   help="a whole model from any transformers config.json (random weights, no download); repeat or "
                        "comma-separate for several, run one after another in one process")
    p.add_argument("--layers", type=int, help="whole model: override num_hidden_layers (e.g. 2 of an 8B model)")
    p.add_argument("--mode", action="append",
                   help="whole model: eager (default), cudagraph, compile; comma-separate several")
    p.add_argument("--masks", choices=("eager", "traced"),
                   help="whole model, cudagraph and compile modes: transformers' attention masks decided as eager "
                        "mode decides them, for every way (default: like for like), or as the capture / trace "
                        "makes transformers decide them (what a user's captured or compiled model runs)")
    p.add_argument("--way", action="append",
                   help="whole model: the ways timed, of torch, enable, patch, patch+enable (default all)")
    p.add_argument("--fast", action="store_true",
                   help="smallest case per op/dtype, few repetitions (whole model: one round, few repetitions)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--json", metavar="PATH", help="write header + rows as JSON")
    p.add_argument("--csv", metavar="PATH", help="write rows as CSV")
    p.add_argument("--plot", metavar="PATH", help="write a roofline PNG (needs matplotlib)")
    p.add_argument("--compare", metavar="OLD.json", help="show what got faster/slower against an earlier --json")
    p.add_argument("--config", choices=("base", "tiny"), help="--model size: base (default) or tiny (2 layers, hidden 64)")
    p.add_argument("--batch", type=int,
                   help="whole model batch (default: 16 bert-base, 8 gpt2, 1 llama, 64 vit images; 2 tiny)")
    p.add_argument("--seq", type=int, help="whole model sequence length (default: 512 bert-base, 1024 gpt2, "
                                           "2048 llama; 16 tiny)")
    p.add_argument("--rounds", type=int,
                   help="whole model timing rounds, the ways interleaved (default: 5; 1 tiny or --fast); "
                        "--host: 9")
    p.add_argument("--host", action="store_true",
                   help="host us per call of every documented call form (xkernels/cli/bench_host.py): on cuda the "
                        "real calls with the device held busy, on cpu the front door with the launch stubbed")
    p.add_argument("--calls", type=int, default=300, help="--host: calls per timed round (default 300)")
    return p.parse_args(argv)


def _fail(msg: str) -> int:
    print(f"xkernels.bench: {msg}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        return _fail("--plot needs matplotlib, which is not installed: pip install 'xkernels[bench]'")
    old = None
    if args.compare:
        try:
            with open(args.compare) as f:
                old = json.load(f)["rows"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return _fail(f"--compare {args.compare}: not a bench --json file ({type(exc).__name__}: {exc})")
    from xkernels.backends import native

    native.module(wait=True)  # the native grad_fns from the first timed call on, not from whenever a build ends
    if args.host:
        from xkernels.cli import bench_host

        return bench_host.run(args.device, args.calls, args.rounds or 9)
    try:
        target = resolve_target(args.device, args.backend)
    except TargetUnavailable as exc:
        return _fail(str(exc))
    if args.model_config or (args.model and args.size is None):
        if args.model_config and (args.op or args.size):
            return _fail("--model-config benches a whole model, every op: it takes no --op or --size")
        if args.op:
            return _fail(f"--op picks op cases: with --model it needs --size {MODELS} (without --size, --model "
                         f"benches a whole model, every op, and takes no --op)")
        if args.plot or args.compare:
            return _fail("--plot and --compare apply to op benches, not to a whole-model bench")
        from xkernels.cli import bench_models

        return bench_models.main(args, target)
    whole = [o for o in ("layers", "mode", "masks", "way", "config", "batch", "seq", "rounds")
             if getattr(args, o) is not None]
    if whole:
        return _fail(f"--{whole[0]} applies to a whole-model bench (--model without --size, or --model-config)")
    size = args.size or ("small" if target.device.type == "cpu" else "all")
    if args.model and size != MODELS:
        return _fail(f"--model picks cases of the real-model corpus: it needs --size {MODELS}")
    try:
        dtypes = [parse_dtype(d) for d in split_list(args.dtype)] or None
        selected = select_cases(split_list(args.op) or list(OP_NAMES), dtypes,
                                list(BENCH_SIZES) if size == "all" else [size], args.fast,
                                split_list(args.model) or None)
    except ValueError as exc:
        return _fail(str(exc))
    settings = perf.FAST if args.fast else perf.BRIEF if size == HELDOUT else perf.FULL
    ceil = perf.ceilings(target)
    head = header(target, ceil, args.fast, args.seed)
    print_header(head, ceil)
    rows: list[dict[str, Any]] = []
    tty = sys.stderr.isatty()
    for i, case in enumerate(selected, 1):
        note = f"[{i}/{len(selected)}] {case.op} {str(case.dtype)[6:]} {case.shape_label} {case.layout}"
        print(f"\r\033[K{note}" if tty else note, end="" if tty else "\n", file=sys.stderr, flush=True)
        try:
            row = perf.bench_case(case, target, ceil, args.seed, settings)
        except Exception as exc:  # report and go on with the other cases
            first = (str(exc).strip().splitlines() or [""])[0]
            row = {"op": case.op, "dtype": str(case.dtype)[6:], "shape": case.shape_label, "layout": case.layout,
                   "device": str(target.device), "backend": target.backend.name,
                   "error": f"{type(exc).__name__}: {first}"}
        rows.append(row)
        print(("\r\033[K" if tty else "") + format_row(row), flush=True)
    summary = perf.confirmed_summary(rows)
    if summary["rows"]:
        print(f"summary: {summary['rows']} rows, geomean {summary['geomean']:.3f}x, worst {summary['worst']:.2f}x "
              f"({summary['worst_case']}); below 1.0x: {summary['below_1_single_pass']} in one pass, "
              f"{summary['below_1_confirmed']} after confirmation (interleaved rounds; columns confirmed, spread)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": head, "rows": rows, "summary": summary}, f, indent=1)
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        plot_roofline(rows, ceil, args.plot)
    if old is not None:
        print(f"compared with {args.compare}:")
        print("\n".join(compare(old, rows)))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
