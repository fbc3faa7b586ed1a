"""Host µs per model step of a patched model against torch's, inference and training, on the CPU:
what the Python around the kernels costs once the kernels themselves cost nothing.

    python tools/probes/host_training.py [--models bert-base,gpt2,vit,llama,linear] [--steps 200]
                                         [--dtype float32] [--profile 12] [--ways torch,patch,enabled]

Each zoo model (``xkernels/harness/model_zoo.py``, tiny config, 2 layers, its tiny batch; text
models get explicit ``position_ids``) and ``linear`` (one ``nn.Linear(64, 256)`` on 32 tokens)
runs under ``use_backend("interpreter")``: xkernels' checks, routes, plans and hot entries run as
on a GPU, but every Triton launch is replaced by a no-op (``Launcher.__call__``: every op
launches through it on the interpreter, its ``hot`` entries included), after two warm-up steps
that launch for real (plans made and cached, routes left). Ways: ``torch`` (the model as built),
``patch`` (``xkernels.patch``), ``enabled`` (``xkernels.enabled()`` around the step); modes:
``forward`` (eval, no grad) and ``train`` (zero_grad, forward, loss = mean square, backward).
Reported: the minimum over ``--rounds`` rounds (the ways' rounds interleaved) of µs per step; the
minimum, as a loaded shared host only ever adds time.

What the µs mean: torch's column computes on the CPU (tiny shapes: mostly its own host path, plus
its GEMMs; float32 by default, as torch's CPU bfloat16 GEMMs are slow and xkernels' host path is
the same per dtype); xkernels' columns compute only what stays on torch (attention, embeddings,
the loss, autograd's own work, aten's backward ops) plus xkernels' host path. The difference is
therefore an upper bound of the extra host cost where xkernels is slower. ``--profile N`` prints
the top N functions by own time (cProfile, ``--steps`` steps) of each xkernels step, and stops
if a Triton interpreter frame ran (a launch that was not stubbed). Under ``enabled`` a routed
op's result is uninitialised, so a model whose control flow or indices read one cannot run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import gc
import inspect
import io
import pstats
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import xkernels
from xkernels.harness import model_zoo
from xkernels.harness.model_runs import loss_of, output_of

MODELS = ("bert-base", "gpt2", "vit", "llama", "linear")


class OneLinear(torch.nn.Module):
    """``linear``: one ``nn.Linear(64, 256)`` on 32 tokens (``xkernels.nn.Linear`` once patched)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@contextlib.contextmanager
def stubbed() -> Iterator[None]:
    """Every launch a no-op inside the block (every op launches through ``Launcher.__call__``)."""
    from xkernels.launch import Launcher

    real = Launcher.__call__
    Launcher.__call__ = lambda self, *a: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Launcher.__call__ = real  # type: ignore[method-assign]


def steps(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, Callable[[], Any]]:
    def forward() -> Any:
        with torch.no_grad():
            return output_of(model(**inputs))

    def train() -> Any:
        model.zero_grad(set_to_none=True)
        loss = loss_of(model(**inputs))
        loss.backward()
        return loss

    return {"forward": forward, "train": train}


def ways(name: str, dtype: torch.dtype, which: list[str]) -> dict[str, tuple[torch.nn.Module, Any, Any]]:
    """way -> (model, inputs, context factory)."""
    if name == "linear":
        torch.manual_seed(0)
        model, inputs = OneLinear().to(dtype), {"x": torch.randn(2, 16, 64, dtype=dtype)}
    else:
        built = model_zoo.build(model_zoo.zoo_config(name, "tiny"), name, dtype, torch.device("cpu"), layers=2,
                                zoo_name=name, size="tiny")
        model, inputs = built.model, dict(built.inputs)
    if "input_ids" in inputs and "position_ids" in inspect.signature(model.forward).parameters:
        # given, so that no routed int add (GPT-2's arange + past length) makes indices, which the
        # stubbed launches of the ``enabled`` way would leave uninitialised
        inputs["position_ids"] = torch.arange(inputs["input_ids"].shape[1]).unsqueeze(0)
    out: dict[str, tuple[torch.nn.Module, Any, Any]] = {}
    for way in which:
        copied = copy.deepcopy(model) if way != "torch" else model
        if way == "patch":
            xkernels.patch(copied)
        ctx = xkernels.enabled if way == "enabled" else contextlib.nullcontext
        out[way] = (copied, inputs, ctx)
    return out


def timed(fn: Callable[[], Any], ctx: Any, n: int) -> float:
    with ctx():
        gc.collect()
        gc.disable()
        try:
            t = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t) / n * 1e6
        finally:
            gc.enable()


def profile(fn: Callable[[], Any], ctx: Any, n: int, top: int) -> str:
    prof = cProfile.Profile()
    with ctx():
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
    s = io.StringIO()
    stats = pstats.Stats(prof, stream=s)
    interp = [k for k in stats.stats if "triton/runtime/interpreter" in k[0]]  # type: ignore[attr-defined]
    if interp:
        raise SystemExit(f"a launch was not stubbed: interpreter frames ran, e.g. {interp[:3]}")
    stats.sort_stats("tottime").print_stats(top)
    lines = [ln for ln in s.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if "ncalls" in ln)
    return "\n".join(lines[start - 1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ways", default="torch,patch,enabled")
    ap.add_argument("--modes", default="forward,train")
    ap.add_argument("--steps", type=int, default=200, help="steps per round (and per profile)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--profile", type=int, default=0, help="top N functions of each patched step's profile")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, a.dtype)
    which = a.ways.split(",")
    print(f"{'model':10} {'mode':8} " + " ".join(f"{w + ' µs':>11}" for w in which)
          + "".join(f" {w + '/torch':>14}" for w in which if w != "torch"), flush=True)
    with xkernels.use_backend("interpreter"):
        for name in a.models.split(","):
            models = ways(name, dtype, which)
            for mode in a.modes.split(","):
                fns = {w: (steps(m, inp)[mode], ctx) for w, (m, inp, ctx) in models.items()}
                for fn, ctx in fns.values():  # real launches: plans made and cached
                    with ctx():
                        fn(), fn()
                with stubbed():
                    for fn, ctx in fns.values():
                        timed(fn, ctx, 5)
                    res: dict[str, list[float]] = {w: [] for w in fns}
                    for _ in range(a.rounds):
                        for w, (fn, ctx) in fns.items():
                            res[w].append(timed(fn, ctx, a.steps))
                    med = {w: min(v) for w, v in res.items()}
                    ratio = "".join(f" {med[w] / med['torch']:14.2f}" for w in which if w != "torch"
                                    and "torch" in med)
                    print(f"{name:10} {mode:8} " + " ".join(f"{med[w]:11.0f}" for w in which) + ratio, flush=True)
                    if a.profile:
                        for w, (fn, ctx) in fns.items():
                            if w != "torch":
                                print(f"--- {name} {mode} {w}: top {a.profile} by own time, {a.steps} steps")
                                print(profile(fn, ctx, a.steps, a.profile), flush=True)


if __name__ == "__main__":
    main()
