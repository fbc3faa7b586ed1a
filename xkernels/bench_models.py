"""``python -m xkernels.bench --model bert-base|gpt2``: whole models on xkernels against torch eager.

    python -m xkernels.bench --model bert-base [--batch 16 --seq 512 --dtype bf16] [--json PATH]
    python -m xkernels.bench --model gpt2 --config tiny --backend interpreter   # seconds, on CPU

The model is built from its transformers config (``BertModel(BertConfig())``,
``GPT2Model(GPT2Config())``: random weights, nothing downloaded; dropout set to 0 so every
variant computes the same function) and run four ways on the same weights and inputs:

* ``torch``: eager PyTorch, the baseline;
* ``enable``: the unmodified model under ``xkernels.enabled()`` (aten add/mm/bmm/addmm routed);
* ``patch``: after ``xkernels.patch(model)`` (linear layers swapped, activations fused);
* ``patch+enable``: both.

Per variant: ``forward`` (eval mode, no grad) and ``forward+backward`` (train mode; loss = mean
of the squared last hidden state in float32) time, median of repeated runs timed with the
backend's events (``xkernels.harness.perf.time_calls``, no cache flush: a model's working set is
larger than any cache), tokens/s and the ratio to torch; the max |deviation| of the forward
output from torch's, and for ``forward+backward`` the largest gradient deviation relative to the
model's largest torch gradient. ``--config tiny`` (2 layers, hidden 64)
runs on the Triton interpreter in seconds.
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
MODEL_SETTINGS = perf.Settings(warmup=3, warmup_s=0.5, min_reps=5, max_reps=50, budget_s=3.0, flush=False)
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


def run(name: str, config: str, batch: int | None, seq: int | None, dtype: torch.dtype, target: Target,
        seed: int = 0, variants: tuple[str, ...] = VARIANTS, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Rows of one model benchmark (one per variant and mode); a failing variant gives an error row."""
    import xkernels

    batch_d, seq_d = DEFAULT_SHAPE[(name, config)]
    batch, seq = batch or batch_d, seq or seq_d
    built = build(name, config, batch, seq, dtype, target.device, seed)
    model, ids = built.model, built.ids
    log(f"{name}: {built.description}, batch {batch} x seq {seq}, {str(dtype)[6:]}, {target}")
    settings = TINY_SETTINGS if config == "tiny" else MODEL_SETTINGS
    base = {"model": name, "config": config, "batch": batch, "seq": seq, "dtype": str(dtype)[6:],
            "device": str(target.device), "backend": target.backend.name}
    rows: list[dict[str, Any]] = []
    ref: dict[str, Any] = {}
    patched = False
    for variant in ("torch", *(v for v in variants if v != "torch")):  # torch first: the reference
        try:
            if variant.startswith("patch") and not patched:
                report = xkernels.patch(model)
                patched = True
                log(str(report))
                base_patch = {"replaced": len(report.replaced), "fused": len(report.fused), "left": len(report.left)}
            routing = xkernels.enabled() if variant.endswith("enable") else _nothing()
            xkernels.routing_counts(reset=True)
            with routing:
                rows.extend(_measure(variant, model, ids, target, settings, ref, base))
                counts = xkernels.routing_counts()
            if variant.endswith("enable"):
                rows[-1]["routed"] = rows[-2]["routed"] = counts
            if variant.startswith("patch"):
                rows[-1]["patch"] = rows[-2]["patch"] = base_patch
        except Exception as exc:  # report and go on with the other variants
            first = (str(exc).strip().splitlines() or [""])[0]
            rows.append({**base, "variant": variant, "mode": "-", "error": f"{type(exc).__name__}: {first}"})
    return rows


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _measure(variant: str, model: torch.nn.Module, ids: torch.Tensor, target: Target, settings: perf.Settings,
             ref: dict[str, Any], base: dict[str, Any]) -> list[dict[str, Any]]:
    tokens = ids.numel()
    model.eval()
    with torch.no_grad():
        out = _forward(model, ids).detach().clone()
        fwd = perf.time_calls(lambda i: _forward(model, i), [ids], target, settings)
    model.train()
    _train_step(model, ids)
    grads = _grads(model)
    step = perf.time_calls(lambda i: _train_step(model, i), [ids], target, settings)
    model.zero_grad(set_to_none=True)
    if variant == "torch":
        ref.update(out=out, grads=grads, forward=fwd.median_ms, step=step.median_ms)
    dev = (out.double() - ref["out"].double()).abs().max().item()
    gdev = _grad_deviation(grads, ref["grads"])
    rows = []
    for mode, timing, torch_ms, extra in (("forward", fwd, ref["forward"], {"max_abs_dev": dev}),
                                          ("forward+backward", step, ref["step"], {"max_abs_dev": dev,
                                                                                    "grad_rel_dev": gdev})):
        rows.append({**base, "variant": variant, "mode": mode, "time_ms": timing.median_ms, "p20_ms": timing.p20_ms,
                     "p80_ms": timing.p80_ms, "reps": timing.reps, "tokens_per_s": tokens / (timing.median_ms * 1e-3),
                     "torch_time_ms": torch_ms, "speedup": torch_ms / timing.median_ms, **extra})
    return rows


def format_row(r: dict[str, Any]) -> str:
    head = f"{r['model']:<10} {r['variant']:<13} {r['mode']:<17}"
    if "error" in r:
        return f"{head} ERROR {r['error']}"
    grad = f"  grad {r['grad_rel_dev']:.2e}" if "grad_rel_dev" in r else ""
    return (f"{head} {r['time_ms']:>10.4g} ms  {r['tokens_per_s']:>12.0f} tok/s  {r['speedup']:5.2f}x  "
            f"max|dev| {r['max_abs_dev']:.2e}{grad}")


def header(target: Target, args: dict[str, Any]) -> dict[str, Any]:
    from xkernels.bench import _version

    props = target.backend.properties(target.device)
    return {"device_name": props.name, "arch": props.arch, "device": str(target.device),
            "backend": target.backend.name, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
            "triton": _version("triton") or _version("triton-ascend"), "transformers": _version("transformers"),
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
            rows = run(args.model, config, args.batch, args.seq, dtype, target, args.seed)
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
