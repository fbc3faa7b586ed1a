"""The routing passes' compile cases for the offline Ascend check (``ops/fused/experts_routing.py``).

They ride on ``gated_linear``'s cases (``gated_linear_compile.gated_cases``) at the experts' gate
pass: where a concatenated-weight class of one dtype plans its (M, 2I) gate pass, the routing
around the same experts layer is planned too, with M = T x K routed rows of H = I columns. Per
(dtype, top_k 2 and 8), with ``CombinePlan`` on meta tensors and the SoC's vector-core count:

* the weighted sum with router weights of the class's dtype (each product rounded to it) and with
  fp32 router weights (Mixtral's: no rounding), rows read through ``inv_perm``;
* the gather's backward (the sum without weights);
* the weighted sum's backward, d(proj) and d(weights);
* on the first dtype only, both kernels with offsets past 2**31 (``INDEX_64``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from xkernels.compile_cases import CompileCase, CompileTarget, meta

#: top_k of the routed rows: Mixtral's 2, Qwen3-MoE's 8
TOP_KS = (2, 8)


def _case(op: Any, target: CompileTarget, rows: int, H: int, K: int, dtype: torch.dtype, w_dtype: torch.dtype,
          grad: bool, weighted: bool, label: str, span: int = 0) -> CompileCase:
    from xkernels.ops.fused.experts_routing import _ROUND, CombinePlan

    prod = torch.promote_types(dtype, w_dtype)
    S = rows if grad else rows * K
    plan = CombinePlan(target.backend, torch.device("meta"), rows, H, K, weighted, True, _ROUND[prod], grad, grad,
                       max(span, S * H))
    p, w, order = meta((S, H), dtype), meta((S,), w_dtype), meta((S,), torch.int64)
    if grad:
        args = (meta((S // K, H), dtype), p, w, order, meta((S, H), dtype), meta((S,), w_dtype), *plan.tail, H, H, H)
    else:
        args = (p, w, order, meta((rows, H), dtype), *plan.tail, H, H)
    c = plan.constexprs
    flags = "".join(f" {k.lower()}" for k in ("PERSISTENT", "INDEX_64") if c[k])
    kind = "combine grad" if grad else "combine" if weighted else "gather grad"
    return target.case(op.name, plan.jit_fn, args, c, str(dtype).removeprefix("torch."),
                       f"routing {kind} kernel {c['BLOCK_T']}x{c['BLOCK_H']} K={K} w {w_dtype}{flags}|{label}")


def routing_cases(op: Any, target: CompileTarget, M: int, N: int, dtype: torch.dtype, label: str,
                  big: bool) -> Iterator[CompileCase]:
    """The routing passes around an experts layer whose gate pass is (M, 2N) (module doc); ``big``:
    also the 64-bit-offset forms."""
    for K in TOP_KS:
        T = max(1, M // K)
        for w_dtype in dict.fromkeys((dtype, torch.float32)):
            yield _case(op, target, T, N, K, dtype, w_dtype, False, True, label)
        yield _case(op, target, T, N, K, dtype, dtype, False, False, label)
        yield _case(op, target, T * K, N, K, dtype, torch.float32, True, True, label)
        if big:
            yield _case(op, target, T, N, K, dtype, torch.float32, False, True, f"{label}, past 2**31", 2**31)
            yield _case(op, target, T * K, N, K, dtype, torch.float32, True, True, f"{label}, past 2**31", 2**31)
