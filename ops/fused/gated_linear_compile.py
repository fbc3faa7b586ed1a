"""``gated_linear``: its compile cases for the offline Ascend check (``Op.compile_cases``).

A call's class is ``{"dtype", "activation", "bias", "weight"}`` (the table conditions of
``gated_linear_plan.bucket_key`` other than the shape: fp16/bf16/fp32 x each activation of
``gated_linear.ACTIVATIONS`` x with/without biases x separate/concatenated weights; ``variant: tma`` never applies on npu,
which has no tensor descriptors). The ``gated_linear`` table's rules are walked per class in
``xkernels.tuning.lookup``'s order (``xkernels.compile_cases.rule_entries``; ``GATED_DEFAULT``
where no rule takes every call of the class: the wave model is not used, see the plan's doc).
Each entry is planned by ``GatedPlan`` with the entry forced, on meta tensors, with the SoC's
cube-core count, on the calls of :func:`gated_layouts`:

* separate weights: no bias; both biases, the gate's only, the up projection's only; the
  concatenated ``(2I, H)`` weight with and without its ``(2I,)`` bias (the same strides as two
  separate weights: those cases share a compilation with the separate ones);
* with biases also the autograd forward (``STORE_PRE``: gate and up written beside y), and
  after it the backward's element-wise kernel (``gate_grad_kernel``) at the same (M, I); for a
  concatenated weight, the experts' gate pass (``gate_kernel`` on the (M, 2I) halves) and, on
  the SiLU classes, GPT-OSS's clamped gate both ways on interleaved columns (``CLAMPED``) and
  the routing passes around such an experts layer (``experts_routing_compile.py``);
* per entry and dtype, on the SwiGLU class (silu, separate weights, biases, autograd): K not a
  multiple of ``BLOCK_K`` (masked K steps), a few output tiles (a program each) and a call whose
  offsets pass 2**31 (``INDEX_64``); every other call runs the persistent loop (more output tiles
  than cube cores).

An entry with ``"VENDOR": true`` (none on npu: the device's BLAS route is a cuda choice) compiles
the vendor route's ``gate_kernel`` for each class instead (its GEMMs are the BLAS's).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from xkernels import tuning
from xkernels.compile_cases import CompileCase, CompileTarget, Entry, dim, meta, rule_entries, shown
from xkernels.ops.fused.experts_routing_compile import routing_cases

GL_DTYPES = ("float16", "bfloat16", "float32")
SHAPE_FIELDS = ("m", "n", "k", "batch")
TABLE = "gated_linear"
#: the class that also gets the uneven-K, few-tile and 64-bit-index calls (SwiGLU with biases)
EXTRAS_CLASS = {"activation": "silu", "bias": True, "weight": "separate"}


def gated_classes(activations: Any) -> list[dict[str, Any]]:
    """Each dtype x activation x with/without biases x separate/concatenated weights."""
    return [{"dtype": d, "activation": a, "bias": b, "weight": w}
            for d in GL_DTYPES for a in activations for b in (False, True) for w in ("separate", "concatenated")]


def gated_entries(op: Any, target: CompileTarget) -> list[Entry]:
    from xkernels.ops.fused.gated_linear_plan import GATED_DEFAULT

    return rule_entries(target, TABLE, op.name, op.compile_classes(), SHAPE_FIELDS, GATED_DEFAULT)


def gated_layouts(cfg: dict[str, Any], shape_when: dict[str, Any], cls: dict[str, Any], cube: int,
                  dtype: torch.dtype) -> Iterator[tuple[str, tuple, dict, bool]]:
    """``(label, args, kwargs, save)`` of ``gated_linear`` calls of class ``cls`` that one entry
    serves (``save``: the autograd forward, gate and up kept)."""
    bm, bn, bk = (int(cfg.get(k, 64)) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    tiles_n = 4
    M = dim("m", bm * (cube // tiles_n + 2), shape_when)  # more output tiles than cube cores
    N, K = dim("n", bn * tiles_n, shape_when), dim("k", 4 * bk, shape_when)
    act = cls["activation"]

    def call(m: int, n: int, k: int, gate_bias: bool, up_bias: bool) -> tuple:
        x = meta((m, k), dtype)
        if cls["weight"] == "concatenated":
            return (x, meta((2 * n, k), dtype), None, meta((2 * n,), dtype) if gate_bias else None, None, act)
        return (x, meta((n, k), dtype), meta((n, k), dtype), meta((n,), dtype) if gate_bias else None,
                meta((n,), dtype) if up_bias else None, act)

    form = "x @ [Wg; Wu].T" if cls["weight"] == "concatenated" else "x @ Wg.T, x @ Wu.T"
    if not cls["bias"]:
        yield f"{form}, {act}", call(M, N, K, False, False), {}, False
        return
    both = " + [bg; bu]" if cls["weight"] == "concatenated" else " + bg, + bu"
    yield f"{form}{both}, {act}", call(M, N, K, True, True), {}, False
    yield f"{form}{both}, {act}, gate and up kept", call(M, N, K, True, True), {}, True
    if cls["weight"] == "separate":
        yield f"{form} + bg, {act}", call(M, N, K, True, False), {}, False
        yield f"{form} + bu, {act}", call(M, N, K, False, True), {}, False
    if all(cls[k] == v for k, v in EXTRAS_CLASS.items()):
        kept = f"{form}{both}, {act}, gate and up kept"
        k_odd = dim("k", 4 * bk + bk // 2, shape_when)
        if k_odd % bk:
            yield f"{kept}, K % BLOCK_K != 0", call(M, N, k_odd, True, True), {}, True
        yield f"{kept}, few tiles", call(dim("m", bm, shape_when), dim("n", 2 * bn, shape_when), K, True, True), {}, True
        big_m = dim("m", 2**31 // N + bm, shape_when)  # y's offsets pass 2**31
        yield f"{kept}, M x I past 2**31", call(big_m, N, K, True, True), {}, True


def gated_cases(op: Any, target: CompileTarget) -> Iterator[CompileCase]:
    cube = target.backend.max_programs("cube")
    for entry in gated_entries(op, target):
        for cls in entry.classes:
            dtype = getattr(torch, cls["dtype"])
            for label, args, kwargs, save in gated_layouts(entry.config, entry.shape_when, cls, cube, dtype):
                call = op.check(*args, **kwargs)
                call.save = save
                with tuning.force(entry.config):
                    plan = op.make_plan(call, target.backend)
                M, N, _ = plan.dims
                y = meta((M, N), dtype)
                if plan.vendor:  # the BLAS's (M, 2I) result halves, or its two (M, I) results
                    gu = meta((M, 2 * N), dtype) if call.concatenated else None
                    g = gu[:, :N] if gu is not None else meta((M, N), dtype)
                    u = gu[:, N:] if gu is not None else meta((M, N), dtype)
                    label = f"vendor BLAS, gate kernel: {label}"
                else:
                    g = meta((M, N), dtype) if save else None
                    u = meta((M, N), dtype) if save else None
                rt = plan.args(call, y, g, u)
                idx = " int64-index" if plan.constexprs.get("INDEX_64") else ""
                loop = " persistent" if plan.constexprs.get("PERSISTENT") else ""
                yield target.case(op.name, plan.jit_fn, rt, plan.constexprs, cls["dtype"],
                                  f"{shown(plan.config)}|{label}{loop}{idx}|{entry.where}")
                if save:  # the backward's element-wise kernel, on the gate and up this forward kept
                    yield _grad_case(op, target, M, N, cls, dtype, f"{label}|{entry.where}")
                    if call.concatenated and not plan.vendor:  # the experts' gate pass at that (M, 2I)
                        yield _gate_pass_case(op, target, M, N, cls, dtype, f"{label}|{entry.where}")
                        if cls["activation"] == "silu":  # and GPT-OSS's clamped one, interleaved, both ways
                            yield _gate_pass_case(op, target, M, N, cls, dtype, f"{label}|{entry.where}", True)
                            yield _grad_case(op, target, M, N, cls, dtype, f"{label}|{entry.where}", True)
                            # and the routing passes around that experts layer (experts_routing_compile.py)
                            yield from routing_cases(op, target, M, N, dtype, f"{label}|{entry.where}",
                                                     big=cls["dtype"] == "bfloat16")


#: GPT-OSS's clamped gate (alpha, limit, shift), the experts' gate pass's other form
GPT_OSS_GLU = (1.702, 7.0, 1.0)


def _grad_case(op: Any, target: CompileTarget, M: int, N: int, cls: dict[str, Any], dtype: torch.dtype,
               label: str, clamped: bool = False) -> CompileCase:
    """``gate_grad_kernel`` at the forward's (M, I): dy, gate and up as the backward reads them
    (the halves of one (M, 2I) buffer for a concatenated weight, whose halves it writes too);
    ``clamped``: GPT-OSS's gate on the interleaved columns of that buffer instead."""
    from xkernels.ops.fused.gated_linear_plan import ClampedGlu, GateGradPlan

    wide = cls["weight"] == "concatenated"
    dy = meta((M, N), dtype)
    pair = meta((M, 2 * N), dtype) if wide else None
    halves = (lambda p: (p[:, 0::2], p[:, 1::2])) if clamped else (lambda p: (p[:, :N], p[:, N:]))
    g, u = halves(pair) if pair is not None else (meta((M, N), dtype), meta((M, N), dtype))
    dg, du = halves(pair) if pair is not None else (meta((M, N), dtype), meta((M, N), dtype))
    strides = (*dy.stride(), *g.stride(), *u.stride(), *dg.stride(), *du.stride())
    plan = GateGradPlan(target.backend, torch.device("meta"), M, N, cls["activation"], strides,
                        ClampedGlu(*GPT_OSS_GLU) if clamped else None)
    flags = "".join(f" {k.lower()}" for k in ("PERSISTENT", "INDEX_64", "CLAMPED") if plan.constexprs[k])
    return target.case(op.name, plan.jit_fn, plan.args(dy, g, u, dg, du), plan.constexprs, cls["dtype"],
                       f"gate grad kernel {plan.constexprs['BLOCK_M']}x{plan.constexprs['BLOCK_N']}{flags}|{label}")


def _gate_pass_case(op: Any, target: CompileTarget, M: int, N: int, cls: dict[str, Any], dtype: torch.dtype,
                    label: str, clamped: bool = False) -> CompileCase:
    """``gate_kernel`` as ``ops/fused/gated_activation.py`` launches it (the experts' gate pass):
    the halves of an (M, 2I) gate_up result, y (M, I) written once; ``clamped``: GPT-OSS's gate
    on its interleaved columns."""
    from xkernels.ops.fused.gated_linear_plan import ClampedGlu, GatePlan

    pair, y = meta((M, 2 * N), dtype), meta((M, N), dtype)
    g, u = (pair[:, 0::2], pair[:, 1::2]) if clamped else (pair[:, :N], pair[:, N:])
    strides = (*g.stride(), *u.stride(), *y.stride())
    plan = GatePlan(target.backend, torch.device("meta"), M, N, cls["activation"], strides,
                    ClampedGlu(*GPT_OSS_GLU) if clamped else None)
    consts = plan.launcher.constexprs
    flags = "".join(f" {k.lower()}" for k in ("PERSISTENT", "INDEX_64", "CLAMPED") if consts[k])
    return target.case(op.name, plan.jit_fn, (g, u, y, *plan.tail), consts, cls["dtype"],
                       f"gate pass kernel {consts['BLOCK_M']}x{consts['BLOCK_N']}{flags}|{label}")
