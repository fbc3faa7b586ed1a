"""``python -m xkernels.bench --model bert-base|gpt2``: whole models on xkernels against torch eager.

    python -m xkernels.bench --model bert-base [--batch 16 --seq 512 --dtype bf16 --rounds 5] [--json PATH]
    python -m xkernels.bench --model gpt2 --config tiny --backend interpreter   # seconds, on CPU

The model is built from its transformers config (``BertModel(BertConfig())``,
``GPT2Model(GPT2Config())``: random weights, nothing downloaded; dropout set to 0 so every
variant computes the same function) and run four ways on the same weights and inputs:

* ``torch``: eager PyTorch, the baseline;
* ``enable``: the unmodified model under ``xkernels.enabled()`` (aten add/mm/bmm/addmm routed);
* ``patch``: after ``xkernels.patch(model)`` (linear layers swapped, activations fused);
* ``patch+enable``: both.

Per variant: ``forward`` (eval mode, no grad) and ``forward+backward`` (train mode; loss = mean
of the squared last hidden state in float32), each timed two ways with the backend's events
(``xkernels.harness.perf.time_calls``, no cache flush: a model's working set is larger than any
cache): *time*, the model as eager PyTorch runs it (host time included where the host is the
slower side, as it usually is for a whole model), and *device time*, the kernels alone (the
device is held busy until the host has queued the whole call). Variants are timed in
interleaved rounds on the same model (``patch`` applied and undone each round), so that the
host's drifting speed meets them alike: medians over rounds, speedups the median of per-round
ratios to torch; tokens/s; the max |deviation| of the forward output from torch's, and for
``forward+backward`` the largest gradient deviation relative to the model's largest torch
gradient. ``--config tiny`` (2 layers, hidden 64) runs on the Triton interpreter in seconds.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from xkernels.harness import Target, perf

MODELS = ("bert-base", "gpt2")
CONFIGS = ("base", "tiny")
VARIANTS = ("torch", "enable", "patch", "patch+enable")
#: (batch, seq) per model and config when not given; base sizes are the project's speed goals.
DEFAULT_SHAPE = {("bert-base", "base"): (16, 512), ("gpt2", "base"): (8, 1024),
                 ("bert-base", "tiny"): (2, 16), ("gpt2", "tiny"): (2, 16)}
TINY = {"hidden": 64, "layers": 2, "heads": 2, "intermediate": 256, "vocab": 128, "positions": 64}
MODEL_SETTINGS = perf.Settings(warmup=2, warmup_s=0.2, min_reps=5, max_reps=30, budget_s=0.5, flush=False)
TINY_SETTINGS = perf.Settings(warmup=1, warmup_s=0.0, min_reps=1, max_reps=3, budget_s=0.0, flush=False)


class ModelsUnavailable(RuntimeError):
    """transformers is not installed (the ``models`` extra)."""


@dataclass
class Built:
    model: torch.nn.Module
    ids: torch.Tensor
    description: str


def build(name: str, config: str, batch: int, seq: int, dtype: torch.dtype, device: torch.device, seed: int) -> Built:
    """The model (random init from its config, dropout 0) and a batch of token ids."""
    try:
        import transformers
    except ImportError as e:
        raise ModelsUnavailable(f"--model needs transformers ({e}): pip install 'xkernels[models]'") from None
    torch.manual_seed(seed)
    tiny = config == "tiny"
    if name == "bert-base":
        size = dict(hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"], num_attention_heads=TINY["heads"],
                    intermediate_size=TINY["intermediate"], vocab_size=TINY["vocab"],
                    max_position_embeddings=TINY["positions"]) if tiny else {}
        cfg = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **size)
        make, positions = transformers.BertModel, cfg.max_position_embeddings
    elif name == "gpt2":
        size = dict(n_embd=TINY["hidden"], n_layer=TINY["layers"], n_head=TINY["heads"], n_inner=TINY["intermediate"],
                    vocab_size=TINY["vocab"], n_positions=TINY["positions"], bos_token_id=0, eos_token_id=0) if tiny else {}
        cfg = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **size)
        make, positions = transformers.GPT2Model, cfg.n_positions
    else:
        raise ValueError(f"--model must be one of {list(MODELS)}, got {name!r}")
    if seq > positions:
        raise ValueError(f"--seq {seq} exceeds the model's {positions} positions")
    if batch < 1 or seq < 1:
        raise ValueError(f"--batch and --seq must be positive, got {batch} and {seq}")
    model = make(cfg).to(device=device, dtype=dtype)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    return Built(model, ids, f"{type(model).__name__} ({config}: {layers} layers, hidden {cfg.hidden_size}, "
                             f"attention {getattr(cfg, '_attn_implementation', None) or 'default'})")


def _forward(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).last_hidden_state


def _train_step(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss = _forward(model, ids).float().square().mean()
    loss.backward()
    return loss


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}


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


class _Variant:
    """Puts the model into one variant's state and back (``with _Variant(...)``)."""

    def __init__(self, variant: str, model: torch.nn.Module, log: Callable[[str], None] | None = None) -> None:
        self.variant, self.model, self.log = variant, model, log
        self.report: Any = None

    def __enter__(self) -> Any:
        import xkernels

        if self.variant.startswith("patch"):
            self.report = xkernels.patch(self.model)
            if self.log is not None:
                self.log(str(self.report))
        self.routing = xkernels.enabled() if self.variant.endswith("enable") else _nothing()
        self.routing.__enter__()
        return self.report

    def __exit__(self, *exc: Any) -> None:
        self.routing.__exit__(*exc)
        if self.report is not None:
            self.report.undo()


def run(name: str, config: str, batch: int | None, seq: int | None, dtype: torch.dtype, target: Target,
        seed: int = 0, variants: tuple[str, ...] = VARIANTS, log: Callable[[str], None] = print,
        rounds: int | None = None) -> list[dict[str, Any]]:
    """Rows of one model benchmark (one per variant and mode); a failing variant gives an error row.

    Each variant first runs once for its outputs and gradients (compared with torch's). Then
    ``rounds`` rounds time every variant in turn on the same model (``patch`` applied and undone
    each round, the order reversed every other round), so that a drift of the host's speed
    meets every variant alike; a variant's figure is the median over rounds, its speedup the
    median of the per-round ratios to torch."""
    import xkernels

    batch_d, seq_d = DEFAULT_SHAPE[(name, config)]
    batch, seq = batch or batch_d, seq or seq_d
    built = build(name, config, batch, seq, dtype, target.device, seed)
    model, ids = built.model, built.ids
    log(f"{name}: {built.description}, batch {batch} x seq {seq}, {str(dtype)[6:]}, {target}")
    settings = TINY_SETTINGS if config == "tiny" else MODEL_SETTINGS
    rounds = rounds or (1 if config == "tiny" else ROUNDS)
    base = {"model": name, "config": config, "batch": batch, "seq": seq, "dtype": str(dtype)[6:],
            "device": str(target.device), "backend": target.backend.name}
    order = ["torch", *(v for v in variants if v != "torch")]  # torch first: the reference
    checked: dict[str, dict[str, Any]] = {}
    errors: list[dict[str, Any]] = []
    ref: dict[str, Any] = {}
    for variant in order:
        try:
            xkernels.routing_counts(reset=True)
            with _Variant(variant, model, log) as report:
                checked[variant] = _outputs(model, ids, ref)
                checked[variant]["routed"] = xkernels.routing_counts()
            if report is not None:
                checked[variant]["patch"] = {"replaced": len(report.replaced), "fused": len(report.fused),
                                             "left": len(report.left)}
        except Exception as exc:  # report and go on with the other variants
            if variant == "torch":
                raise
            errors.append({**base, "variant": variant, "mode": "-", "error": _first_line(exc)})
    timed = [v for v in order if v in checked]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(v, m): [] for v in timed for m in MODES}
    for r in range(rounds):
        for variant in timed if r % 2 == 0 else timed[::-1]:
            with _Variant(variant, model):
                for mode, timing in _time(model, ids, target, settings).items():
                    times[(variant, mode)].append(timing)
    rows = []
    for variant in timed:
        for mode in MODES:
            mine, theirs = times[(variant, mode)], times[("torch", mode)]
            ms, dev = _median([t for t, _ in mine]), _median([d for _, d in mine])
            extra = {"max_abs_dev": checked[variant]["dev"]}
            if mode == "forward+backward":
                extra["grad_rel_dev"] = checked[variant]["gdev"]
            if variant.endswith("enable"):
                extra["routed"] = checked[variant]["routed"]
            if "patch" in checked[variant]:
                extra["patch"] = checked[variant]["patch"]
            rows.append({**base, "variant": variant, "mode": mode, "time_ms": ms, "device_ms": dev,
                         "rounds": rounds, "round_ms": [t for t, _ in mine],
                         "tokens_per_s": ids.numel() / (ms * 1e-3), "torch_time_ms": _median([t for t, _ in theirs]),
                         "torch_device_ms": _median([d for _, d in theirs]),
                         "speedup": _median([t / m for (t, _), (m, _) in zip(theirs, mine)]),
                         "device_speedup": _median([t / m for (_, t), (_, m) in zip(theirs, mine)]), **extra})
    return rows + errors


MODES = ("forward", "forward+backward")
#: timing rounds per variant (each a full measurement; the host's speed drifts between them)
ROUNDS = 5


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _outputs(model: torch.nn.Module, ids: torch.Tensor, ref: dict[str, Any]) -> dict[str, Any]:
    """The forward output's and the gradients' deviation from torch's (``ref``, filled by the
    first call: torch's own run)."""
    model.eval()
    with torch.no_grad():
        out = _forward(model, ids).detach().clone()
    model.train()
    _train_step(model, ids)
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    if not ref:
        ref.update(out=out, grads=grads)
    return {"dev": (out.double() - ref["out"].double()).abs().max().item(), "gdev": _grad_deviation(grads, ref["grads"])}


def _time(model: torch.nn.Module, ids: torch.Tensor, target: Target,
          settings: perf.Settings) -> dict[str, tuple[float, float]]:
    """Per mode: (time, device time) in ms. *Time* is what the model takes as eager PyTorch runs
    it: the device is held only ``perf.HOLD_US`` ahead, so where the host is slower than the
    kernels (a whole model's forward usually is) the host's time shows. *Device time* holds the
    device for twice the host's time per call first, so the kernels run back to back: the
    kernels' own speed, without the host's."""
    def forward(i: torch.Tensor) -> Any:
        with torch.no_grad():
            return _forward(model, i)

    result = {}
    for mode, fn, train in (("forward", forward, False), ("forward+backward", lambda i: _train_step(model, i), True)):
        model.train(train)
        t = perf.time_calls(fn, [ids], target, settings)
        t0 = time.perf_counter()
        fn(ids)
        host_us = (time.perf_counter() - t0) * 1e6  # queueing one call, at most (it may wait on the device)
        d = perf.time_calls(fn, [ids], target, settings, hold_us=max(perf.HOLD_US, 2 * host_us))
        result[mode] = (t.median_ms, d.median_ms)
    model.zero_grad(set_to_none=True)
    return result


def format_row(r: dict[str, Any]) -> str:
    head = f"{r['model']:<10} {r['variant']:<13} {r['mode']:<17}"
    if "error" in r:
        return f"{head} ERROR {r['error']}"
    grad = f"  grad {r['grad_rel_dev']:.2e}" if "grad_rel_dev" in r else ""
    return (f"{head} {r['time_ms']:>9.4g} ms {r['speedup']:5.2f}x  device {r['device_ms']:>9.4g} ms "
            f"{r['device_speedup']:5.2f}x  {r['tokens_per_s']:>10.0f} tok/s  max|dev| {r['max_abs_dev']:.2e}{grad}")


def header(target: Target, args: dict[str, Any]) -> dict[str, Any]:
    props = target.backend.properties(target.device)
    return {"device_name": props.name, "arch": props.arch, "device": str(target.device),
            "backend": target.backend.name, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
            "triton": perf.package_version("triton") or perf.package_version("triton-ascend"),
            "transformers": perf.package_version("transformers"),
            "python": platform.python_version(), "host": platform.node(), "args": args}


def main(args: Any, target: Target) -> int:
    """``bench --model``: print the rows, write ``--json``; exit 1 if a variant failed, 2 if the
    model cannot be built here."""
    import json
    import sys

    from xkernels.dispatch import use_backend
    from xkernels.harness.cases import parse_dtype

    config = args.config or "base"
    dtypes = [d for v in args.dtype or [] for d in v.split(",") if d]
    if len(dtypes) > 1:
        print(f"xkernels.bench: --model takes one --dtype, got {dtypes}", file=sys.stderr)
        return 2
    try:
        dtype = parse_dtype(dtypes[0]) if dtypes else (torch.float32 if target.device.type == "cpu" else torch.bfloat16)
        with use_backend(target.backend):
            if args.rounds is not None and args.rounds < 1:
                raise ValueError(f"--rounds must be positive, got {args.rounds}")
            rows = run(args.model, config, args.batch, args.seq, dtype, target, args.seed, rounds=args.rounds)
    except (ModelsUnavailable, ValueError) as exc:
        print(f"xkernels.bench: {exc}", file=sys.stderr)
        return 2
    for r in rows:
        print(format_row(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header(target, {k: v for k, v in vars(args).items() if v is not None}), "rows": rows},
                      f, indent=1)
    return 1 if any("error" in r for r in rows) else 0
