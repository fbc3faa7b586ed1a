"""``python -m xkernels.bench --model NAME|all`` / ``--model-config PATH``: whole models on
xkernels against torch, in eager, CUDA-graph and ``torch.compile`` modes (docs/models.md).

    python -m xkernels.bench --model llama [--mode eager,cudagraph,compile] [--json PATH] [--csv PATH]
    python -m xkernels.bench --model-config config.json --layers 2 [--batch B --seq S]
    python -m xkernels.bench --model all --config tiny --backend interpreter   # seconds per model, on CPU

The model (``xkernels/harness/model_zoo.py``: random weights from its transformers config,
dropout 0) runs four *ways* on the same weights and inputs: ``torch``; ``enable`` (under
``xkernels.enabled()``); ``patch`` (after ``xkernels.patch(model)``); ``patch+enable``. Each way
in each *mode* (``xkernels/harness/model_runs.py``) is timed for its ``forward`` (eval, no grad)
and ``forward+backward`` (train; loss = mean square of the output in float32) *passes*, two ways
each with the backend's events: *wall* time (the model as the host drives it; where the host
queues kernels slower than the device runs them, host time) and *device* time (the device held
busy until the host has queued the whole call: the kernels alone). The ways are timed in
interleaved rounds on the same model (``patch`` applied and undone around each; the order
reversed every other round; under ``torch.compile`` each patched way on its own copy, patched
once), so that a drift of the host's speed meets them alike: device and
host time in turns of a few calls per way, wall time one step at a time with the ways switching
every step (a warm-up step after each switch; ``STEP_ROUNDS_PER_ROUND`` such rounds per round).
Per way: the median over rounds and the 20th/80th percentiles; speedups: the median of per-round
ratios to torch. Each way first runs once for its output and gradients, compared with the torch
way's.

Before the first model, the run waits for the native extension (``xkernels/backends/native.py``),
which an ordinary process builds in the background on first use and then loads from its cache:
timing while it builds would measure the first minute of a fresh install for the first models,
and the steady state for the later ones (the fused ops' training policies differ between the
two). The header's ``native`` says what ran: ``loaded``, or ``unavailable`` and why (``XKERNELS_NATIVE=0``: off).
"""

from __future__ import annotations

import contextlib
import copy
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from xkernels.harness import Target, model_zoo, perf
from xkernels.harness.model_runs import MASKS, MODES, PASSES, make_runner, unavailable_reason

WAYS = ("torch", "enable", "patch", "patch+enable")
#: short turns, many rounds: an H100 host's speed drifted by tens of percent over seconds (the
#: same torch forward 8.0 then 5.3 ms host, 2026-11-27), so each way's turn in a round is kept to
#: well under a second and the ratio is the median over more rounds
MODEL_SETTINGS = perf.Settings(warmup=2, warmup_s=0.05, min_reps=3, max_reps=20, budget_s=0.2, flush=False)
TINY_SETTINGS = perf.Settings(warmup=1, warmup_s=0.0, min_reps=1, max_reps=3, budget_s=0.0, flush=False)
#: timing rounds per way (each a full measurement; the host's speed drifts between them)
ROUNDS = 9
#: rounds of per-step wall samples (ways switching every step) per timing round
STEP_ROUNDS_PER_ROUND = 3


@dataclass
class Spec:
    """One model to bench: a zoo entry or a config file."""

    name: str
    data: dict[str, Any]
    source: str
    zoo_name: str | None = None
    size: str = "base"


def zoo_spec(name: str, size: str = "base") -> Spec:
    return Spec(name, model_zoo.zoo_config(name, size), f"--model {name}", name, size)


def file_spec(path: str) -> Spec:
    data = model_zoo.read_config(path)
    label = (data.get("architectures") or [None])[0] or data.get("model_type") or "model"
    return Spec(str(label), data, f"--model-config {path}")


class _Way:
    """Puts the model into one way's state and back (``with _Way(...)``). ``patched``: the report
    of a model patched once for the whole mode (compile mode's own copies), which stays patched."""

    def __init__(self, way: str, model: torch.nn.Module, log: Callable[[str], None] | None = None,
                 patched: Any = None) -> None:
        self.way, self.model, self.log, self.patched = way, model, log, patched
        self.report: Any = None

    def __enter__(self) -> Any:
        import xkernels

        if self.way.startswith("patch") and self.patched is None:
            self.report = xkernels.patch(self.model)
            if self.log is not None:
                _log_report(self.way, self.report, self.log)
        self.routing = xkernels.enabled() if self.way.endswith("enable") else _nothing()
        self.routing.__enter__()
        return self.report or self.patched

    def __exit__(self, *exc: Any) -> None:
        self.routing.__exit__(*exc)
        if self.report is not None:
            self.report.undo()


def _log_report(way: str, report: Any, log: Callable[[str], None]) -> None:
    lines = str(report).splitlines()
    kinds = ", ".join(f"{k} {n}" for k, n in report.counts().items()) or "none"
    log("\n".join([f"  {way}: {lines[0]}; fused: {kinds}", *(f"  {x}" for x in lines[1:] if x.startswith("  left"))]))


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def run(spec: Spec, dtype: torch.dtype, target: Target, batch: int | None = None, seq: int | None = None,
        layers: int | None = None, modes: tuple[str, ...] = ("eager",), ways: tuple[str, ...] = WAYS,
        rounds: int | None = None, fast: bool = False, seed: int = 0, log: Callable[[str], None] = print,
        text_seq_only: bool = False, masks: str = "eager") -> list[dict[str, Any]]:
    """Rows of one model's benchmark: per mode, way and pass; a way that fails gives an error row,
    a mode that cannot run here a ``skipped`` row with the reason. ``text_seq_only``: ``seq`` is
    for text models (a vision model of a multi-model run keeps its own). ``masks``: how the
    captured and compiled modes decide transformers' attention masks (``model_runs.MASKS``), in
    each of their rows."""
    if masks not in MASKS:
        raise ValueError(f"--masks must be among {list(MASKS)}, got {masks!r}")
    built = model_zoo.build(spec.data, spec.source, dtype, target.device, batch, seq, layers, seed,
                            spec.zoo_name, spec.size, text_seq_only)
    log(f"{spec.name}: {built.description}, batch {built.batch}"
        f"{f' x seq {built.seq}' if built.seq else ' clips' if built.kind == 'audio' else ' images'} "
        f"({built.tokens} tokens), {str(dtype)[6:]}, {target}")
    quick = fast or spec.size == "tiny"
    settings = TINY_SETTINGS if quick else MODEL_SETTINGS
    rounds = rounds or (1 if quick else ROUNDS)
    base = {"model": spec.name, **built.info, "batch": built.batch, "seq": built.seq, "tokens": built.tokens,
            "dtype": str(dtype)[6:], "device": str(target.device), "backend": target.backend.name, **versions()}
    rows: list[dict[str, Any]] = []
    for mode in modes:
        why = unavailable_reason(mode, target)
        if why:
            log(f"  {mode}: skipped: {why}")
            rows.append({**base, "mode": mode, "way": "-", "pass": "-", "skipped": why})
            continue
        rows += _run_mode(mode, built, {**base, "masks": masks} if mode != "eager" else base, target, ways,
                          settings, rounds, log)
        if mode == "compile":
            torch._dynamo.reset()  # the next model compiles afresh; this one's graphs are freed
    return rows


def _run_mode(mode: str, built: model_zoo.Built, base: dict[str, Any], target: Target, ways: tuple[str, ...],
              settings: perf.Settings, rounds: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    import xkernels

    order = ["torch", *(w for w in ways if w != "torch")]  # torch first: the reference
    # Under torch.compile each way runs on its own copy of the model, patched once and compiled
    # once, as a user's model is. One model switched between the ways (patched and undone around
    # each call, every way's graph in the cache of the one forward) read a patched Phi-3's compiled
    # forward at 0.95x of torch's wall and one bf16 ulp off its output; on its own copy it read
    # 0.998x, bit for bit (results/2026-12-01-h200-family-speed)
    own = mode == "compile"
    models = {w: copy.deepcopy(built.model) if own and w != "torch" else built.model for w in order}
    kept: dict[str, Any] = {}
    try:
        for w in order:
            if own and w.startswith("patch"):
                kept[w] = xkernels.patch(models[w])
                _log_report(w, kept[w], log)
        return _run_ways(mode, built, models, kept, base, target, order, settings, rounds, log)
    finally:
        for report in kept.values():
            report.undo()


def _run_ways(mode: str, built: model_zoo.Built, models: dict[str, torch.nn.Module], kept: dict[str, Any],
              base: dict[str, Any], target: Target, order: list[str], settings: perf.Settings, rounds: int,
              log: Callable[[str], None]) -> list[dict[str, Any]]:
    import xkernels

    checked: dict[str, dict[str, Any]] = {}
    runners: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    ref: dict[str, Any] = {}
    for way in order:
        model = models[way]
        try:
            xkernels.routing_counts(reset=True)
            with _Way(way, model, log, kept.get(way)) as report:
                runners[way] = make_runner(mode, model, built.inputs, target, base.get("masks", "eager"))
                checked[way] = _outputs(runners[way], ref)
                checked[way]["routed"] = xkernels.routing_counts()
            if report is not None:
                checked[way]["patch"] = {"patch_replaced": len(report.replaced), "patch_fused": len(report.fused),
                                         "patch_left": len(report.left), "fusions": report.counts()}
        except Exception as exc:  # report and go on with the other ways
            errors.append({**base, "mode": mode, "way": way, "pass": "-", "error": _first_line(exc)})
            log(f"  {mode} {way}: {errors[-1]['error']}")
            if way == "torch":  # nothing to compare the others with
                return errors
    timed = [w for w in order if w in checked]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(w, p): [] for w in timed for p in PASSES}
    try:
        for r in range(rounds):
            for way in timed if r % 2 == 0 else timed[::-1]:
                with _Way(way, models[way], patched=kept.get(way)):
                    for p, timing in _time(runners[way], target, settings).items():
                        times[(way, p)].append(timing)
        steps = rounds if settings is TINY_SETTINGS else rounds * STEP_ROUNDS_PER_ROUND  # tiny: a smoke run
        walls = _alternating_walls(timed, runners, models, kept, target, steps)
    except Exception as exc:  # a replay or compiled call failing while timed: this mode's rows are lost
        errors.append({**base, "mode": mode, "way": way, "pass": "-", "error": f"while timed: {_first_line(exc)}"})
        log(f"  {mode} {way}: {errors[-1]['error']}")
        for runner in runners.values():
            runner.release()
        return errors
    rows = []
    for way in timed:
        for p in PASSES:
            rows.append(_row({**base, "mode": mode, "way": way, "pass": p}, times[(way, p)], times[("torch", p)],
                             walls[(way, p)], walls[("torch", p)], checked[way], runners[way].setup_s,
                             built.tokens))
    for runner in runners.values():
        runner.release()
    return rows + errors


def _row(head: dict[str, Any], mine: list[tuple[float, float]], theirs: list[tuple[float, float]],
         wall: list[float], torch_wall: list[float], checked: dict[str, Any], setup_s: float,
         tokens: int) -> dict[str, Any]:
    """A row: device and host from the turns (``mine``, ``theirs``: per round (device, host)),
    wall from the per-step samples (``wall``, ``torch_wall``: per step round)."""
    dev, host = [d for d, _ in mine], [h for _, h in mine]
    row = {**head, "wall_ms": _quantile(wall, 0.5), "wall_p20_ms": _quantile(wall, 0.2),
           "wall_p80_ms": _quantile(wall, 0.8), "device_ms": _quantile(dev, 0.5),
           "device_p20_ms": _quantile(dev, 0.2), "device_p80_ms": _quantile(dev, 0.8),
           "host_ms": _quantile(host, 0.5), "host_p20_ms": _quantile(host, 0.2), "host_p80_ms": _quantile(host, 0.8),
           "torch_wall_ms": _quantile(torch_wall, 0.5),
           "torch_device_ms": _quantile([d for d, _ in theirs], 0.5),
           "torch_host_ms": _quantile([h for _, h in theirs], 0.5),
           "speedup": _quantile([t / m for t, m in zip(torch_wall, wall)], 0.5),
           "device_speedup": _quantile([t[0] / m[0] for t, m in zip(theirs, mine)], 0.5),
           "host_speedup": _quantile([t[1] / m[1] for t, m in zip(theirs, mine)], 0.5),
           "tokens_per_s": tokens / (_quantile(wall, 0.5) * 1e-3), "rounds": len(mine), "wall_steps": len(wall),
           "wall_round_ms": wall, "device_round_ms": dev, "host_round_ms": host, "setup_s": setup_s,
           "max_abs_dev": checked["dev"]}
    if head["pass"] == "forward+backward":
        row["grad_rel_dev"] = checked["gdev"]
    if head["way"].endswith("enable"):
        row["routed"] = checked["routed"]
    row.update(checked.get("patch", {}))
    return row


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (the median of an even count: the mean of
    the middle two)."""
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _grad_deviation(got: dict[str, torch.Tensor | None], want: dict[str, torch.Tensor | None]) -> float:
    """``max |g - g_torch|`` over every parameter's gradient, relative to the largest |torch
    gradient| of the model (per-parameter ratios would divide rounding noise by rounding noise
    where a gradient is zero in exact arithmetic, e.g. attention's key bias). A missing gradient
    is an error."""
    missing = [n for n, g in got.items() if g is None and want.get(n) is not None]
    if missing:
        raise RuntimeError(f"no gradient reached {len(missing)} parameters (e.g. {missing[0]})")
    present = [(got[n], w) for n, w in want.items() if w is not None]
    scale = max((w.abs().max().item() for _, w in present), default=0.0) or 1.0
    return max(((g.double() - w.double()).abs().max().item() for g, w in present), default=0.0) / scale


def _outputs(runner: Any, ref: dict[str, Any]) -> dict[str, Any]:
    """The forward output's and the gradients' deviation from the torch way's (``ref``, filled by
    the first call: the torch way's own run)."""
    out = runner.forward().detach().clone()
    runner.train_step()
    grads = {n: None if g is None else g.detach().clone() for n, g in runner.grads().items()}
    runner.model.zero_grad(set_to_none=True)
    if not ref:
        ref.update(out=out, grads=grads)
    return {"dev": (out.double() - ref["out"].double()).abs().max().item(), "gdev": _grad_deviation(grads, ref["grads"])}


def _alternating_walls(ways: list[str], runners: dict[str, Any], models: dict[str, torch.nn.Module],
                       kept: dict[str, Any], target: Target, rounds: int) -> dict[tuple[str, str], list[float]]:
    """Wall ms per (way, pass): ``rounds`` rounds, each one step of every way per pass (a warm-up
    step in that way first), the ways switching every step and their order reversed every other
    round. A way's sample and torch's are then tens of milliseconds apart, not the seconds of a
    turn: an H100 host's drift over seconds had put BERT-base's patched forward at 0.87x in
    turn-based rounds and 1.12x switching every step (results/2026-11-27-h100-one-linear-node)."""
    walls: dict[tuple[str, str], list[float]] = {(w, p): [] for w in ways for p in PASSES}
    for r in range(rounds):
        for p, attr in zip(PASSES, ("forward", "train_step")):
            for way in ways if r % 2 == 0 else ways[::-1]:
                with _Way(way, models[way], patched=kept.get(way)):
                    fn = getattr(runners[way], attr)
                    fn()
                    target.backend.synchronize(target.device)
                    t0 = time.perf_counter()
                    fn()
                    target.backend.synchronize(target.device)
                    walls[(way, p)].append((time.perf_counter() - t0) * 1e3)
    for model in models.values():
        model.zero_grad(set_to_none=True)
    return walls


def _time(runner: Any, target: Target, settings: perf.Settings) -> dict[str, tuple[float, float]]:
    """Per pass: (device, host) ms (wall: :func:`_alternating_walls`). *Device*: the device is
    held for twice the host's time per call first, so the
    kernels run back to back: their own speed, without the host's. *Host*: the host's own time to
    queue one pass, started on an idle device (``perf_counter`` around the call; median of
    ``settings.min_reps`` calls). Where the host is the slower side (a host-bound model) the device
    keeps up and this is the host's cost alone; where the device is slower, queueing waits once the
    driver's launch queue is full, so it is then an upper bound. (Holding the device busy for the
    whole pass instead fills that queue on a training step of ~1000 kernels, and every launch
    after waits for the hold.)"""
    result = {}
    for p, fn in zip(PASSES, (runner.forward, runner.train_step)):
        call = lambda _: fn()
        for _ in range(max(settings.warmup, 1)):
            fn()
        t0 = time.perf_counter()
        fn()
        host_us = (time.perf_counter() - t0) * 1e6  # queueing one call, at most (it may wait on the device)
        d = perf.time_calls(call, [None], target, settings, hold_us=max(perf.HOLD_US, 2 * host_us))
        result[p] = (d.median_ms, host_ms(fn, target, max(settings.min_reps, 1)))
    runner.model.zero_grad(set_to_none=True)
    return result


def interleaved_device_ms(runners: dict[str, Any], target: Target, rounds: int,
                          which: str = "forward+backward") -> dict[str, tuple[float, float, float]]:
    """Device ms of pass ``which`` (``"forward"`` / ``"forward+backward"``) per runner, timed in
    ``rounds`` rounds whose order alternates: ``{name: (median, min, max)}`` over the rounds (the
    probes' A/Bs of one model's ways)."""
    per: dict[str, list[float]] = {k: [] for k in runners}
    for i in range(rounds):
        for k in list(runners) if i % 2 == 0 else list(runners)[::-1]:
            per[k].append(_time(runners[k], target, MODEL_SETTINGS)[which][0])
    return {k: (statistics.median(v), min(v), max(v)) for k, v in per.items()}


def host_ms(fn: Callable[[], Any], target: Target, reps: int) -> float:
    """Median host milliseconds of ``fn()`` over ``reps`` calls, each started on an idle device."""
    times = []
    for _ in range(reps):
        target.backend.synchronize(target.device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    target.backend.synchronize(target.device)
    return _quantile(times, 0.5)


def versions() -> dict[str, str | None]:
    return {"torch": torch.__version__, "triton": perf.package_version("triton") or perf.package_version("triton-ascend"),
            "transformers": perf.package_version("transformers")}


def format_row(r: dict[str, Any]) -> str:
    head = f"{r['model']:<16.16} {r['mode']:<9} {r['way']:<12} {r['pass']:<16}"
    if r.get("masks") == "traced":
        head += " (masks as traced)"
    if "skipped" in r:
        return f"{head} skipped: {r['skipped']}"
    if "error" in r:
        return f"{head} ERROR {r['error']}"
    grad = f"  grad {r['grad_rel_dev']:.1e}" if "grad_rel_dev" in r else ""
    return (f"{head} wall {r['wall_ms']:>8.4g} ms [{r['wall_p20_ms']:.4g}-{r['wall_p80_ms']:.4g}] {r['speedup']:5.2f}x"
            f"  device {r['device_ms']:>8.4g} ms [{r['device_p20_ms']:.4g}-{r['device_p80_ms']:.4g}] "
            f"{r['device_speedup']:5.2f}x  host {r['host_ms']:>8.4g} ms {r['host_speedup']:5.2f}x  "
            f"{r['tokens_per_s']:>9.0f} tok/s  max|dev| {r['max_abs_dev']:.1e}{grad}")


def header(target: Target, args: dict[str, Any]) -> dict[str, Any]:
    from xkernels.backends import native

    props = target.backend.properties(target.device)
    return {"device_name": props.name, "arch": props.arch, "device": str(target.device),
            "backend": target.backend.name, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **versions(),
            "python": platform.python_version(), "host": platform.node(), "native": native.status(), "args": args}


def settle_native() -> str:
    """Wait for the native extension's build or load (the module doc); its status line."""
    from xkernels.backends import native

    native.module(wait=True)
    return native.status()


def write_csv(rows: list[dict[str, Any]], path: str) -> None:
    """One line per row; lists and dicts (per-round times, fusions, routing counts) as JSON text."""
    import csv

    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in r.items()})


def _split(values: list[str] | str | None) -> list[str]:
    items = values if isinstance(values, list) else [values] if values else []
    return [x for v in items for x in v.split(",") if x]


def main(args: Any, target: Target) -> int:
    """``bench --model`` / ``--model-config``: print the rows, write ``--json`` / ``--csv``; exit 1
    if a way failed (or, of several models, one cannot be built here: its row says why), 2 if the
    arguments are wrong or the one model cannot be built here."""
    import sys

    from xkernels import dispatch
    from xkernels.dispatch import use_backend
    from xkernels.harness.cases import parse_dtype

    def fail(msg: str) -> int:
        print(f"xkernels.bench: {msg}", file=sys.stderr)
        return 2

    dtypes, modes, ways = _split(args.dtype), tuple(_split(args.mode) or ["eager"]), tuple(_split(args.way) or WAYS)
    if len(dtypes) > 1:
        return fail(f"--model takes one --dtype, got {dtypes}")
    if any(m not in MODES for m in modes):
        return fail(f"--mode must be among {list(MODES)}, got {list(modes)}")
    if any(w not in WAYS for w in ways):
        return fail(f"--way must be among {list(WAYS)}, got {list(ways)}")
    if args.rounds is not None and args.rounds < 1:
        return fail(f"--rounds must be positive, got {args.rounds}")
    masks = getattr(args, "masks", None) or "eager"
    if masks not in MASKS:
        return fail(f"--masks must be among {list(MASKS)}, got {masks!r}")
    if getattr(args, "masks", None) and modes == ("eager",):
        return fail(f"--masks {masks} applies to the cudagraph and compile modes (eager mode decides its masks "
                    "itself): add --mode cudagraph or --mode compile")
    if args.model_config and args.config:
        return fail("--config picks a built-in model's size; with --model-config, shrink the config itself "
                    "(or use --layers)")
    names = _split(args.model)
    rows: list[dict[str, Any]] = []
    try:
        names = model_zoo.model_names() if names == ["all"] else names
        specs = [zoo_spec(n, args.config or "base") for n in names]
        specs += [file_spec(path) for path in _split(args.model_config)]
        dtype = parse_dtype(dtypes[0]) if dtypes else (torch.float32 if target.device.type == "cpu" else torch.bfloat16)
        # a backend other than the device's own is forced for the run; the device's own needs no
        # use_backend block (a user's model runs without one, and enable()'s C++ overrides defer
        # every call to Python while a block is open anywhere: timing them inside one would time
        # the Python overrides)
        own = dispatch.select(target.device).name == target.backend.name
        print(f"xkernels.bench: native extension {settle_native()}", flush=True)
        with contextlib.nullcontext() if own else use_backend(target.backend):
            for spec in specs:
                try:
                    mine = run(spec, dtype, target, args.batch, args.seq, args.layers, modes, ways, args.rounds,
                               bool(args.fast), args.seed, text_seq_only=len(specs) > 1, masks=masks)
                except ValueError as exc:
                    if len(specs) == 1:
                        raise
                    # one of several models cannot be built here: its error row, and the others run
                    mine = [{"model": spec.name, "mode": "-", "way": "-", "pass": "-", "error": str(exc)}]
                for r in mine:
                    print(format_row(r), flush=True)
                rows += mine
    except (model_zoo.ModelsUnavailable, ValueError) as exc:
        return fail(str(exc))
    head = header(target, {k: v for k, v in vars(args).items() if v is not None})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": head, "rows": rows}, f, indent=1)
    if args.csv:
        write_csv(rows, args.csv)
    return 1 if any("error" in r for r in rows) else 0
