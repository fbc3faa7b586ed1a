"""``rotary_embedding``: its compile cases for the offline Ascend check (``Op.compile_cases``).

A call's class is ``{"dtype", "pass"}`` (the ``rotary`` table's non-shape conditions: q's dtype,
fp16 / bf16 / fp32, and ``"forward"`` or ``"backward"``, the transposed rotation that autograd's
backward launches); the shape fields are ``d`` (the head dim) and ``rows`` (q's rows plus k's).
The table's rules are walked per class in ``xkernels.tuning.lookup``'s order
(``xkernels.compile_cases.rule_entries``; the op's ``DEFAULT`` where no rule takes every call).
Each entry is planned by ``RotaryPlan`` with the entry forced, on meta tensors, with the SoC's
vector-core count, on the calls of :func:`rotary_layouts`; the kernel's runtime arguments are
those ``RotaryPlan.run`` hands its launcher (recorded, not recomputed), so sizes or strides equal
to 1 are specialized as at launch. Head geometries (:data:`HEADS`): head dim 64, 128 and 256 with
full rotary, 128 with rotary 64 (partial rotary 0.5) and 80 with rotary 32 (Phi-2's 0.4). The
calls, each as the forward and as the backward (the results' gradients in the results' layout):

* every head geometry: prefill / training, ``(B, H, S, D)``, the projection's ``(B, S, H, D)``
  transposed as transformers makes it, cos / sin ``(B, S, R)`` unsqueezed at dim 1, k with fewer
  (GQA) heads: the persistent loop (more row tiles than vector cores on every SoC);
* the head dims of a 128-wide tile (128, 128 with rotary 64, 80 with rotary 32: ``D`` and
  ``HALF`` are runtime ints, so these share one compilation per call): decode of one sequence,
  ``(1, H, 1, D)``: a few row tiles, a program each (no loop), batch and sequence sizes 1
  (specialized);
* head dim 128: the prefill call with q's offsets past 2**31 (``INDEX_64``), the prefill call
  with adjacent pairs (``interleaved=True``: Cohere's, GLM's rotation); as the forward only,
  packed tokens ``(T, H, D)`` with cos ``(T, R)`` (two leading dims: the first, padded, is
  1) and a batched decode ``(64, H, 1, D)`` (sequence size 1) in the persistent loop.

Per SoC and dtype: 12 forward and 10 backward cases, 8 and 6 compilations (66 cases per SoC, 42
compilations per memory class).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from xkernels import tuning
from xkernels.compile_cases import CompileCase, CompileTarget, Entry, meta, rule_entries, shown

RT_DTYPES = ("float16", "bfloat16", "float32")
PASSES = ("forward", "backward")
SHAPE_FIELDS = ("d", "rows")
TABLE = "rotary"


@dataclass(frozen=True)
class Heads:
    """A head geometry: head dim ``d``, rotary dim ``r``, q's and k's head counts."""

    d: int
    r: int
    heads: int
    kv_heads: int

    @property
    def label(self) -> str:
        return f"head dim {self.d}" + (f", rotary {self.r}" if self.r < self.d else "")


#: Llama-3.2-1B (64, 32 / 8 heads), Llama-3-8B (128, 32 / 8), Gemma-7B (256, 16 / 16), a partial
#: rotary of 0.5 on 128 (32 / 8), Phi-2 (80, rotary 32, 32 / 32)
HEADS = (Heads(64, 64, 32, 8), Heads(128, 128, 32, 8), Heads(256, 256, 16, 16), Heads(128, 64, 32, 8),
         Heads(80, 32, 32, 32))
#: the head dims of one 128-wide tile (``BLOCK_D`` 128; ``D`` and ``HALF`` are runtime ints): one
#: compilation per call, so the decode call is made for these only
TILE_128 = (HEADS[1], HEADS[3], HEADS[4])
#: the head geometry that also gets the 64-bit-offset, packed-token and batched-decode calls
EXTRAS = HEADS[1]
PREFILL = (2, 4096)  # batch, sequence


def rotary_entries(op: Any, target: CompileTarget) -> list[Entry]:
    # the op's built-in config, from the module that made the op (which imports this one: no
    # import back, no cycle)
    default = inspect.getmodule(type(op)).DEFAULT
    classes = [{"dtype": d, "pass": p} for p in PASSES for d in RT_DTYPES]
    return rule_entries(target, TABLE, op.name, classes, SHAPE_FIELDS, default)


def _bhsd(h: Heads, batch: int, seq: int, dtype: torch.dtype) -> tuple:
    """transformers' layout: ``proj(x).view(B, S, H, D).transpose(1, 2)``, cos ``(B, S, R)`` at dim 1."""
    q = meta((batch, seq, h.heads, h.d), dtype).transpose(1, 2)
    k = meta((batch, seq, h.kv_heads, h.d), dtype).transpose(1, 2)
    return q, k, meta((batch, seq, h.r), dtype), meta((batch, seq, h.r), dtype), 1


def _packed(h: Heads, tokens: int, dtype: torch.dtype) -> tuple:
    """Packed tokens ``(T, H, D)``, cos ``(T, R)`` at dim 1."""
    return (meta((tokens, h.heads, h.d), dtype), meta((tokens, h.kv_heads, h.d), dtype),
            meta((tokens, h.r), dtype), meta((tokens, h.r), dtype), 1)


def rotary_layouts(h: Heads, dtype: torch.dtype, backward: bool) -> Iterator[tuple[str, tuple]]:
    """``(label, (q, k, cos, sin, unsqueeze_dim))`` of the calls one head geometry gets as the
    forward (``backward``: as the backward, the results' gradients in the results' layout; see
    the module doc)."""
    batch, seq = PREFILL
    yield f"{h.label}, prefill (B, H, S, D) {batch}x{seq}", _bhsd(h, batch, seq, dtype)
    if h not in TILE_128:
        return
    yield f"{h.label}, decode (1, H, 1, D)", _bhsd(h, 1, 1, dtype)
    if h != EXTRAS:
        return
    long = 2**31 // (batch * h.heads * h.d) + 1024  # q's offsets pass 2**31
    yield f"{h.label}, prefill {batch}x{long}, offsets past 2**31", _bhsd(h, batch, long, dtype)
    yield f"{h.label}, prefill (B, H, S, D) {batch}x{seq}, adjacent pairs", (*_bhsd(h, batch, seq, dtype), True)
    if not backward:
        yield f"{h.label}, packed tokens (T, H, D) T={batch * seq}", _packed(h, batch * seq, dtype)
        yield f"{h.label}, batched decode (B, H, 1, D) B=64", _bhsd(h, 64, 1, dtype)


class _Recorder:
    """Stands in for the plan's launcher: keeps the runtime arguments ``RotaryPlan.run`` passes."""

    args: tuple[Any, ...] = ()

    def __call__(self, *args: Any) -> None:
        self.args = args

    def hot(self, args: tuple[Any, ...], ptrs: int) -> None:  # no repeat launch: each case is planned once
        return None


def _key(call: Any) -> dict[str, int]:
    rows = sum(t.numel() // t.shape[-1] for t in (call.q, call.k))
    return {"d": int(call.q.shape[-1]), "rows": rows}


def rotary_cases(op: Any, target: CompileTarget) -> Iterator[CompileCase]:
    for entry in rotary_entries(op, target):
        for cls in entry.classes:
            dtype, backward = getattr(torch, cls["dtype"]), cls["pass"] == "backward"
            made = 0
            for h in HEADS:
                for label, args in rotary_layouts(h, dtype, backward):
                    call = op.check(*args)  # the backward: the results' gradients in their layout
                    if not tuning.matches(entry.shape_when, _key(call)):
                        continue
                    assert call.kernel_ok, call.fallback_reason
                    call.backward = backward
                    with tuning.force(entry.config):
                        plan = op.make_plan(call, target.backend)
                    plan.launcher = rec = _Recorder()
                    plan.run(call)
                    c = plan.constexprs
                    tags = "".join(f" {k.lower()}" for k in ("INTERLEAVED", "PERSISTENT", "INDEX_64") if c[k])
                    made += 1
                    yield target.case(op.name, plan.jit_fn, rec.args, c, cls["dtype"],
                                      f"{shown(plan.config)}|{cls['pass']}, {label}{tags}|{entry.where}")
            if not made:
                target.notes.append(f"{op.name} on {target.soc}: {entry.where} {entry.config} is not compiled "
                                    f"for {cls}: no layout in its range {entry.shape_when}")
