"""One call of one op: a :class:`Case` names the op, its operands (:class:`T`: shape, dtype, memory
layout) and a layout label; ``case.make_inputs(device, seed)`` builds fresh random tensors for one
call (:class:`Inputs`). The case lists are in :mod:`xkernels.harness.cases`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from xkernels.harness.torch_ops import OPS

INT_RANGE = (-1000, 1000)  # random ints: sums and promotions to float16 stay exact


# -- operands -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class T:
    """A tensor operand: the shape the op sees, its dtype and memory layout.

    ``view``: ``contiguous``; ``transposed`` (last two dims swapped in memory, ``.mT``);
    ``strided`` (every other element of the last dim, ``[..., ::2]``); ``expanded`` (all dims
    but the last have stride 0); ``heads`` (a ``(b, h, s, d)`` attention operand as transformers
    lays it out: a ``(b, s, h*d)`` projection viewed ``(b, s, h, d)`` and transposed, random
    values); ``cos`` / ``sin`` (a ``(b, s, r)`` rotary table, not random: the cos / sin of real
    rotary angles, :func:`rotary_angles`, at base ``theta``); ``cos pairs`` / ``sin pairs`` (the
    same angles with each one twice side by side, as the adjacent-pair families lay them out).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    view: str = "contiguous"
    theta: float = 10000.0  # the rotary base of a ``cos`` / ``sin`` operand (rope_theta)


def random_tensor(shape: Iterable[int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random values on the CPU: normal floats (never all zeros), ints in ``INT_RANGE``."""
    shape = tuple(shape)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    return torch.randint(*INT_RANGE, shape, generator=gen, dtype=dtype)


#: the longest position a rotary table of several sequences (``b > 1``) reaches: each sequence
#: starts at its own position below it (a batch of sequences at different lengths, decode steps)
MAX_POSITION = 2048


def rotary_positions(b: int, s: int) -> torch.Tensor:
    """``(b, s)`` int64 positions of a rotary table: ``0 .. s-1`` for one sequence (a prefill
    from the start); for several, sequence ``i`` continues from its own length ``(389 i) mod
    (MAX_POSITION - s)`` (as transformers' ``position_ids`` of a batch of different lengths, or
    of decode steps). Fixed by the shape, so that ``cos`` and ``sin`` of a case agree."""
    starts = torch.zeros(b, dtype=torch.int64) if b == 1 else \
        (torch.arange(b, dtype=torch.int64) * 389) % max(MAX_POSITION - s, 1)
    return starts[:, None] + torch.arange(s, dtype=torch.int64)


def rotary_angles(b: int, s: int, r: int, theta: float, pairs: bool = False) -> torch.Tensor:
    """``(b, s, r)`` float32 angles as transformers' default rotary embedding computes them
    (``LlamaRotaryEmbedding``): ``inv_freq = 1 / theta ** (arange(0, r, 2) / r)``, the angles
    ``positions * inv_freq`` in float32, concatenated with themselves (``rotate_half``'s halves);
    ``pairs``: each angle twice side by side (Cohere's ``repeat_interleave``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, r, 2, dtype=torch.int64).float() / r))
    freqs = rotary_positions(b, s).float()[..., None] * inv_freq
    return freqs.repeat_interleave(2, dim=-1) if pairs else torch.cat((freqs, freqs), dim=-1)


def _materialize(spec: T, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    shape = spec.shape
    if spec.view == "contiguous":
        return random_tensor(shape, spec.dtype, gen).to(device)
    if spec.view == "transposed":
        base = random_tensor((*shape[:-2], shape[-1], shape[-2]), spec.dtype, gen).to(device)
        return base.mT
    if spec.view == "strided":
        base = random_tensor((*shape[:-1], 2 * shape[-1]), spec.dtype, gen).to(device)
        return base[..., ::2]
    if spec.view == "expanded":
        base = random_tensor((*([1] * (len(shape) - 1)), shape[-1]), spec.dtype, gen).to(device)
        return base.expand(shape)
    if spec.view == "heads":
        b, h, n, d = shape
        return random_tensor((b, n, h * d), spec.dtype, gen).to(device).view(b, n, h, d).transpose(1, 2)
    if spec.view in ("cos", "sin", "cos pairs", "sin pairs"):  # in float32, cast (transformers: .to(x.dtype))
        angles = rotary_angles(*shape, spec.theta, pairs=spec.view.endswith("pairs"))
        return (angles.cos() if spec.view.startswith("cos") else angles.sin()).to(device, spec.dtype)
    raise ValueError(f"unknown operand view {spec.view!r}")


@dataclass
class Inputs:
    """The arguments of one call. ``out`` (if any) is in ``kwargs``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def out(self) -> torch.Tensor | None:
        return self.kwargs.get("out")

    def named_tensors(self, arg_names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Input tensors by argument name (``out`` excluded)."""
        named = dict(zip(arg_names, self.args))
        named.update({k: v for k, v in self.kwargs.items() if k != "out"})
        return {k: v for k, v in named.items() if isinstance(v, torch.Tensor)}


@dataclass(frozen=True)
class Case:
    """One call of one op: operands, layout label, size tags. ``dtype`` is the dtype under test
    (the first tensor operand's; with Python numbers only, PyTorch's result dtype); promotions
    are named in ``layout``."""

    op: str
    args: tuple[Any, ...]  # T specs or Python scalars
    layout: str
    sizes: frozenset[str]
    kwargs: tuple[tuple[str, Any], ...] = ()
    out: str | None = None  # None | "new" | "inplace" (out is the first operand) | "residual" (out is it)
    models: tuple[str, ...] = ()  # the models a corpus case comes from (see harness.models)
    #: the bench times forward + backward (``perf.bench_case``): the sum of the results against
    #: random output gradients, through autograd, on both sides
    backward: bool = False
    dtype: torch.dtype = field(init=False)

    def __post_init__(self) -> None:
        first = next((a for a in self.args if isinstance(a, T)), None)
        dtype = first.dtype if first is not None else torch.result_type(*self.args[:2])
        object.__setattr__(self, "dtype", dtype)

    @property
    def shapes(self) -> tuple[tuple[int, ...] | Any, ...]:
        return tuple(a.shape if isinstance(a, T) else a for a in self.args)

    @property
    def shape_label(self) -> str:
        def one(a: Any) -> str:
            if isinstance(a, T):
                return "x".join(map(str, a.shape)) if a.shape else "[]"
            return repr(a)

        shown = [a for a in self.args if a is not None and not isinstance(a, str)]  # not activations
        return OPS[self.op].joiner.join(one(a) for a in shown)

    @property
    def id(self) -> str:
        return f"{self.op}/{str(self.dtype).removeprefix('torch.')}/{self.layout}/{self.shape_label}"

    def seed_for(self, seed: int) -> int:
        """A per-case seed derived from the run's seed (different cases get different data)."""
        return zlib.crc32(f"{seed}/{self.id}".encode())

    def make_inputs(self, device: torch.device | str, seed: int) -> Inputs:
        """Fresh random operands on ``device`` (generated on the CPU, so any device sees the same
        values for a seed); ``out`` is allocated but not initialised (the accuracy check poisons it)."""
        device = torch.device(device)
        gen = torch.Generator().manual_seed(self.seed_for(seed))
        args = tuple(_materialize(a, gen, device) if isinstance(a, T) else a for a in self.args)
        kwargs = {k: _materialize(v, gen, device) if isinstance(v, T) else v for k, v in self.kwargs}
        if self.out == "inplace":
            kwargs["out"] = args[0]
        elif self.out == "residual":
            kwargs["out"] = kwargs["residual"]
        elif self.out == "new":
            meta = expected_result(self.op, Inputs(args, kwargs))
            kwargs["out"] = torch.empty(meta.shape, dtype=meta.dtype, device=device)
        return Inputs(args, kwargs)


def expected_result(op: str, inputs: Inputs) -> torch.Tensor:
    """PyTorch's result for these inputs on the meta device: its shape and dtype, no data."""

    def meta(v: Any) -> Any:
        return v.to("meta") if isinstance(v, torch.Tensor) else v

    kwargs = {k: meta(v) for k, v in inputs.kwargs.items() if k != "out"}
    return OPS[op].torch_fn(*(meta(a) for a in inputs.args), **kwargs)
