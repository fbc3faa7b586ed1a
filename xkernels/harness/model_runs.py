"""How ``bench --model`` runs a whole model in each mode: eager, CUDA graphs, ``torch.compile``.

    runner = make_runner("cudagraph", model, inputs, target)   # captures here, in the model's current state
    runner.forward()       # eval mode, no grad: the output tensor (logits or last hidden state)
    runner.train_step()    # train mode: loss = mean square of that output in float32, backward; grads in .grad

* ``eager``: the model as PyTorch runs it, ``zero_grad(set_to_none=True)`` before each step.
* ``cudagraph``: the forward and the training step (forward + backward, static inputs) are each
  captured once in a ``torch.cuda.CUDAGraph`` after warm-up calls on the capture's side stream
  (PyTorch's recipe: gradients set to ``None`` before capture, so the backward allocates them in
  the graph's pool and each replay writes them again); a call is one ``replay()``. What is
  captured is the model as it is at capture time (patched or not, routed or not): replays
  ignore later changes. Needs a cuda device (:func:`unavailable_reason` says why not).
* ``compile``: ``torch.compile(model)`` (default mode, inductor), compiled at the first call in
  the model's state then; dynamo guards on the modules' classes, so a patched model compiles a
  graph of its own (xkernels ops are one opaque node each) and a later call in the other state
  picks the graph of that state again. Routing (``enable()``) changes no guard: the compiled
  graph of the unrouted model runs, its aten calls made by inductor's own code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from xkernels.harness import Target
from xkernels.harness.model_zoo import output_of

MODES = ("eager", "cudagraph", "compile")
PASSES = ("forward", "forward+backward")
#: eager calls on the side stream before a capture (allocations, Triton compilation, autotuning)
GRAPH_WARMUP = 3


def unavailable_reason(mode: str, target: Target) -> str | None:
    """Why ``mode`` cannot run on ``target`` (``None`` where it can)."""
    if mode not in MODES:
        raise ValueError(f"--mode must be among {list(MODES)}, got {mode!r}")
    if mode == "cudagraph" and target.device.type != "cuda":
        return (f"CUDA graphs need a cuda device (torch.cuda.CUDAGraph); this run is on {target.device} "
                f"(backend {target.backend.name!r})")
    if mode == "compile" and not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    return None


def loss_of(out: Any) -> torch.Tensor:
    return output_of(out).float().square().mean()


class Runner:
    """One way's forward and training step in one mode; ``setup_s``: what making it took (capture
    or compilation at the first calls included)."""

    mode = "eager"

    def __init__(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> None:
        self.model, self.inputs = model, inputs
        self.call: Callable[..., Any] = model
        self.setup_s = 0.0

    def forward(self) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad():
            return output_of(self.call(**self.inputs))

    def train_step(self) -> torch.Tensor:
        self.model.train()
        self.model.zero_grad(set_to_none=True)
        loss = loss_of(self.call(**self.inputs))
        loss.backward()
        return loss

    def grads(self) -> dict[str, torch.Tensor | None]:
        """The gradients of the last :meth:`train_step`, by parameter name."""
        return {n: p.grad for n, p in self.model.named_parameters()}

    def release(self) -> None:
        """Drop what the runner holds (graphs and their memory pools)."""


class Compiled(Runner):
    mode = "compile"

    def __init__(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: Target) -> None:
        super().__init__(model, inputs)
        self.call = torch.compile(model)
        t0 = time.perf_counter()
        self.forward()  # compiles (or picks the graph of this state) now, not in the timing
        self.train_step()
        target.backend.synchronize(target.device)
        self.setup_s = time.perf_counter() - t0


class Graphed(Runner):
    mode = "cudagraph"

    def __init__(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: Target) -> None:
        super().__init__(model, inputs)
        eager = Runner(model, inputs)
        t0 = time.perf_counter()
        with torch.cuda.device(target.device):
            model.eval()
            with torch.no_grad():
                self.fwd_graph, self.fwd_out = _capture(eager.forward, lambda: output_of(model(**inputs)))
            model.train()
            self.train_graph, self.loss = _capture(eager.train_step, lambda: _backward(model, inputs),
                                                   before=lambda: model.zero_grad(set_to_none=True))
        self._grads = {n: p.grad for n, p in model.named_parameters()}  # the graph's: each replay rewrites them
        target.backend.synchronize(target.device)
        self.setup_s = time.perf_counter() - t0

    def forward(self) -> torch.Tensor:
        self.fwd_graph.replay()
        return self.fwd_out

    def train_step(self) -> torch.Tensor:
        self.train_graph.replay()
        return self.loss

    def grads(self) -> dict[str, torch.Tensor | None]:
        return dict(self._grads)  # .grad of the parameters may be another way's capture's by now

    def release(self) -> None:
        for p in self.model.parameters():
            p.grad = None
        self.fwd_graph = self.train_graph = self.fwd_out = self.loss = None  # type: ignore[assignment]
        self._grads = {}


def _backward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    loss = loss_of(model(**inputs))
    loss.backward()
    return loss


def _capture(warm: Callable[[], Any], body: Callable[[], Any],
             before: Callable[[], None] | None = None) -> tuple[Any, Any]:
    """``body`` captured in a CUDA graph after ``GRAPH_WARMUP`` calls of ``warm`` on the side
    stream that then captures it: (graph, body's result: static tensors each replay rewrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(GRAPH_WARMUP):
            warm()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    if before is not None:
        before()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = body()
    return graph, out


def make_runner(mode: str, model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: Target) -> Runner:
    """The runner of ``mode`` for the model in its current state (raises if ``mode`` cannot run:
    see :func:`unavailable_reason`)."""
    why = unavailable_reason(mode, target)
    if why:
        raise RuntimeError(why)
    if mode == "cudagraph":
        return Graphed(model, inputs, target)
    if mode == "compile":
        return Compiled(model, inputs, target)
    return Runner(model, inputs)
