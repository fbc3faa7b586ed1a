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
  ignore later changes. Needs a cuda device (:func:`unavailable_reason` says why not). The
  captured loss is kept detached (:func:`captured_step`): a loss holding its autograd graph
  keeps the parameters' AccumulateGrad nodes, with the capture's side stream, alive into the
  next way's capture on another stream (torch's "AccumulateGrad node's stream does not match").
* ``compile``: ``torch.compile(model)`` (default mode, inductor), compiled at the first call in
  the model's state then; dynamo guards on the modules' classes, so a patched model compiles a
  graph of its own (xkernels ops are one opaque node each) and a later call in the other state
  picks the graph of that state again. Routing (``enable()``) changes no guard: the compiled
  graph of the unrouted model runs, its aten calls made by inductor's own code.

Captured and compiled calls run under :func:`eager_mask_decisions` (``masks="eager"``, the
default), so that they compute what the eager call computes; ``masks="traced"`` leaves the
decisions to transformers as a user's captured or compiled model meets them (:data:`MASKS`).
transformers' SDPA mask helpers skip the attention mask (so that SDPA may run its flash kernel)
only when they believe nothing is being traced, and their ``is_tracing()`` is true during a
CUDA-graph capture and while dynamo traces. In transformers
5.17 (that of results/2026-11-24-h100-model-modes) this held even with no ``attention_mask`` at
all, which is what the bench passes: eager BERT ran SDPA unmasked, its captured and compiled
graphs built a dense (batch, 1, seq, seq) mask and ran masked SDPA in all 12 layers, forward and
backward (BERT-base's replays measured 20 / 45 ms against 4 / 15 ms of eager device time, the
same for torch and patch; compile 10 / 31 ms). Llama's causal mask took the same path, in 2
layers where attention is a small share of the step, so its rows looked sane. transformers 5.23
skips a missing mask under capture, but a causal model's packed-sequence check (which eager
answers by reading the positions) still builds Llama's mask there, and under dynamo on
torch < 2.14 ``is_torchdynamo_exporting()`` reads true (the causal mask again).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from xkernels.harness import Target
from xkernels.harness.model_zoo import output_of

MODES = ("eager", "cudagraph", "compile")
#: how captured and compiled calls decide transformers' attention masks: as eager mode decides them
#: for every way (like for like), or as the capture / trace makes transformers decide them
MASKS = ("eager", "traced")
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


@contextlib.contextmanager
def eager_mask_decisions(inputs: dict[str, Any]) -> Iterator[None]:
    """While active, transformers' SDPA mask helpers decide as in an eager call of the model on
    ``inputs``, where a capture or a trace would otherwise make them build a mask:

    * "is tracing" asked about no tensor (``is_tracing()``, ``is_tracing(None)``: there is no
      padding mask to read) answers ``False``, and so does ``is_torchdynamo_exporting()`` (the
      bench never exports; dynamo on torch < 2.14 answers it ``True`` while it traces). Asked
      about a tensor, ``is_tracing`` answers as before: no mask's values are read while a graph
      is captured or traced.
    * where ``inputs`` hold neither ``position_ids`` nor ``attention_mask`` (the bench's never
      do), ``find_packed_sequence_indices`` answers ``None`` (one sequence per row), which eager
      reads from the positions the model makes itself (0..seq-1 on every row, one host sync per
      call) and a capture or trace cannot read: a causal model (Llama, GPT-2) would otherwise
      build a packed-sequence causal mask.

    A no-op where transformers' ``masking_utils`` is not loaded. The replacements are module
    functions, the same objects on every call: dynamo guards on the helpers it inlined, and new
    ones would retrace each compiled call."""
    mu = sys.modules.get("transformers.masking_utils")
    if mu is None or not callable(getattr(mu, "is_tracing", None)):
        yield
        return
    patches: dict[str, Any] = {"is_tracing": _is_tracing_of_a_tensor, "is_torchdynamo_exporting": _not_exporting}
    if "position_ids" not in inputs and "attention_mask" not in inputs:
        patches["find_packed_sequence_indices"] = _one_sequence_per_row
    saved = {name: getattr(mu, name) for name in patches if hasattr(mu, name) and getattr(mu, name) is not patches[name]}
    _TRANSFORMERS.setdefault("is_tracing", saved.get("is_tracing", mu.is_tracing))
    for name in saved:
        setattr(mu, name, patches[name])
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(mu, name, value)


#: transformers' own ``is_tracing``, called by :func:`_is_tracing_of_a_tensor`
_TRANSFORMERS: dict[str, Callable[..., bool]] = {}


def _is_tracing_of_a_tensor(tensor: Any = None) -> bool:
    return False if tensor is None else _TRANSFORMERS["is_tracing"](tensor)


def _not_exporting() -> bool:
    return False


def _one_sequence_per_row(position_ids: torch.Tensor) -> None:
    return None


def mask_decisions(masks: str, inputs: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
    """The context a captured or compiled call runs in: :func:`eager_mask_decisions` for
    ``"eager"``, nothing for ``"traced"`` (:data:`MASKS`)."""
    if masks not in MASKS:
        raise ValueError(f"masks must be among {list(MASKS)}, got {masks!r}")
    return eager_mask_decisions(inputs) if masks == "eager" else contextlib.nullcontext()


def captured_forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor], masks: str = "eager") -> torch.Tensor:
    """What the ``cudagraph`` mode's forward graph captures (eval, no grad around it): the
    output tensor, the model's masks decided as ``masks`` says (:func:`mask_decisions`)."""
    with mask_decisions(masks, inputs):
        return output_of(model(**inputs))


def captured_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor], masks: str = "eager") -> torch.Tensor:
    """What the ``cudagraph`` mode's training-step graph captures: forward (masks as ``masks``
    says), loss, backward; the loss detached (its autograd graph released after the backward)."""
    with mask_decisions(masks, inputs):
        loss = loss_of(model(**inputs))
    loss.backward()
    return loss.detach()


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

    def __init__(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: Target,
                 masks: str = "eager") -> None:
        super().__init__(model, inputs)
        compiled = torch.compile(model)
        mask_decisions(masks, inputs)  # a bad value raises here, before compiling

        def call(*args: Any, **kwargs: Any) -> Any:
            # every call, not only the tracing one: dynamo guards on the helpers it inlined, and
            # a call without them would retrace the mask-materializing path inside the timing
            with mask_decisions(masks, inputs):
                return compiled(*args, **kwargs)

        self.call = call
        t0 = time.perf_counter()
        self.forward()  # compiles (or picks the graph of this state) now, not in the timing
        self.train_step()
        target.backend.synchronize(target.device)
        self.setup_s = time.perf_counter() - t0


class Graphed(Runner):
    mode = "cudagraph"

    def __init__(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: Target,
                 masks: str = "eager") -> None:
        super().__init__(model, inputs)
        mask_decisions(masks, inputs)  # a bad value raises here, before capturing
        eager = Runner(model, inputs)
        t0 = time.perf_counter()
        with torch.cuda.device(target.device):
            model.eval()
            with torch.no_grad():
                self.fwd_graph, self.fwd_out = _capture(eager.forward, lambda: captured_forward(model, inputs, masks))
            model.train()
            self.train_graph, self.loss = _capture(eager.train_step, lambda: captured_step(model, inputs, masks),
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


def make_runner(mode: str, model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: Target,
                masks: str = "eager") -> Runner:
    """The runner of ``mode`` for the model in its current state (raises if ``mode`` cannot run:
    see :func:`unavailable_reason`); ``masks``: how captured and compiled calls decide the
    model's attention masks (:data:`MASKS`; eager mode decides them itself)."""
    if masks not in MASKS:
        raise ValueError(f"masks must be among {list(MASKS)}, got {masks!r}")
    why = unavailable_reason(mode, target)
    if why:
        raise RuntimeError(why)
    if mode == "cudagraph":
        return Graphed(model, inputs, target, masks)
    if mode == "compile":
        return Compiled(model, inputs, target, masks)
    return Runner(model, inputs)
