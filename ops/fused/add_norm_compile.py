"""``add_layer_norm`` / ``add_rms_norm``: their compile cases for the offline Ascend check
(``Op.compile_cases``).

A call's class is ``{"norm": "layer"|"rms", "dtype": s's dtype}`` (the ``add_norm`` table's
non-shape conditions); the table's rules are walked per class in ``xkernels.tuning.lookup``'s
order (``xkernels.compile_cases.rule_entries``; the op's ``DEFAULT`` where no rule takes every
call). Each entry is planned by ``AddNormPlan`` with the entry forced, on meta tensors, with the
SoC's vector-core count, on the calls of :func:`add_norm_layouts`:

* one pass (``N <= BLOCK_N``) at the widest row the entry serves (``BLOCK_N`` = its cap), with
  x + residual, weight (and bias for LayerNorm), s and the statistics written (the autograd
  forward): the most live tiles; the same without residual, weight, bias or s (``y = norm(x)``);
  an inference call (s written, no statistics; RMSNorm with ``offset=1``, Gemma's ``1 + w``,
  which is a runtime scalar and so the same compilation as ``offset=0``); and for fp16/bf16 the
  same with fp32 weight and bias (mixed-precision parameters);
* for an fp32 sum, the autograd forward of a bf16 x with an fp32 residual, weight and bias (the
  residual stream of training under ``torch.autocast``: each branch's bf16 output added to the
  fp32 residual), one pass and chunked;
* chunked (``N > BLOCK_N``, two passes over the row) where the entry's range has such rows: the
  autograd forward and the inference call;
* every one of them in the persistent loop (more row tiles than vector cores, as the npu
  backend launches); the autograd forward also with a few row tiles (one program each) and
  with 64-bit row offsets (rows x N past 2**31), once per code path.

The backward (``add_norm_bwd_kernel``, then ``part_sum_kernel`` for d(w)/d(b)): each rule with
``"pass": "backward"`` (and ``BWD_DEFAULT`` where none takes a class), planned by ``BwdPlan`` with
the SoC's cores, at the widest one-chunk row the entry serves and at a chunked row where its
range has one: every gradient from the saved sum and the sum's gradient (the most live tiles);
x + residual recomputed, no sum gradient (an fp32 sum from a bf16 x and an fp32 residual, so
d(x) and d(residual) are written apart; a half-precision sum from both in its dtype); d(x) alone
(no d(w)/d(b), no partials); the full form with 64-bit offsets; ``part_sum_kernel`` after the
full form, with the parameters in the activations' dtype and in fp32.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from xkernels import tuning
from xkernels.compile_cases import CompileCase, CompileTarget, Entry, dim, meta, rule_entries, shown

AN_DTYPES = ("float16", "bfloat16", "float32")
SHAPE_FIELDS = ("n", "rows")
TABLE = "add_norm"


def add_norm_entries(op: Any, target: CompileTarget) -> list[Entry]:
    from xkernels.ops.fused.add_norm_plan import DEFAULT

    classes = [{"norm": op.kind, "dtype": d} for d in AN_DTYPES]
    # the backward's rules ("pass": "backward") are planned by _backward_cases
    return rule_entries(target, TABLE, op.name, classes, SHAPE_FIELDS, DEFAULT,
                        keep=lambda when: when.get("pass") != "backward")


def _widths(cfg: dict[str, Any], shape_when: dict[str, Any]) -> tuple[int, int | None]:
    """``(one-pass N, chunked N or None)`` inside the entry's range: the widest row of one chunk
    (``BLOCK_N`` = the entry's cap), and a row of two and a half chunks where the range has one."""
    cap = max(16, int(cfg["BLOCK_N"]))
    one = dim("n", cap, shape_when)
    want = 2 * cap + cap // 2
    chunked = dim("n", want, shape_when)
    return one, chunked if chunked > cap else None


def add_norm_layouts(op: Any, target: CompileTarget, cfg: dict[str, Any], shape_when: dict[str, Any],
                     dtype: torch.dtype) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(label, call)`` of the calls one entry serves (see the module doc); ``call`` holds the
    arguments of ``op.check`` plus ``stats`` (autograd keeps mean/rstd) and ``rows``/``n``."""
    layer = op.kind == "layer"
    bm = max(1, int(cfg["BLOCK_M"]))
    vec = target.backend.max_programs("vector")
    many = dim("rows", bm * (2 * vec + 1), shape_when)  # more row tiles than vector cores: persistent
    few = dim("rows", 2 * bm, shape_when)  # two row tiles, a program each
    one, chunked = _widths(cfg, shape_when)
    full = dict(residual=True, weight=True, bias=layer, return_sum=True, stats=True)
    bare = dict(residual=False, weight=False, bias=False, return_sum=False, stats=False)
    infer = dict(residual=True, weight=True, bias=layer, return_sum=True, stats=False, offset=0.0 if layer else 1.0)
    what_full = "y, s = norm(x + r) * w" + (" + b" if layer else "") + "; mean/rstd kept"
    what_infer = "y, s = norm(x + r) * " + ("w + b" if layer else "(1 + w)")
    for width, path in ((one, "one pass"), (chunked, "chunked")):
        if width is None:
            continue
        yield f"{path}, {what_full}", dict(full, rows=many, n=width)
        yield f"{path}, {what_infer}", dict(infer, rows=many, n=width)
        if path == "one pass":
            yield f"{path}, y = norm(x)", dict(bare, rows=many, n=width)
            if dtype != torch.float32:
                yield f"{path}, {what_infer}, fp32 w", dict(infer, rows=many, n=width, param_dtype=torch.float32)
            yield f"{path}, {what_full}, few rows", dict(full, rows=few, n=width)
        if dtype == torch.float32:  # mixed-precision training's residual stream: a bf16 branch + the fp32 residual
            yield f"{path}, {what_full}, bf16 x", dict(full, rows=many, n=width, x_dtype=torch.bfloat16)
        big = dim("rows", 2**31 // width + 2 * bm, shape_when)
        yield f"{path}, {what_full}, rows x N past 2**31", dict(full, rows=big, n=width)


def add_norm_cases(op: Any, target: CompileTarget) -> Iterator[CompileCase]:
    yield from _forward_cases(op, target)
    yield from _backward_cases(op, target)


def _backward_cases(op: Any, target: CompileTarget) -> Iterator[CompileCase]:
    from xkernels.ops.fused import add_norm_kernels as K
    from xkernels.ops.fused.add_norm_bwd import BWD_DEFAULT, BwdPlan

    layer = op.kind == "layer"
    classes = [{"pass": "backward", "norm": op.kind, "dtype": d} for d in AN_DTYPES]
    entries = rule_entries(target, TABLE, op.name, classes, SHAPE_FIELDS, BWD_DEFAULT,
                           keep=lambda when: when.get("pass") == "backward")
    dev = torch.device("meta")
    for entry in entries:
        if entry.config.get("backward", "kernel") != "kernel":
            continue
        bm = max(1, int(entry.config["BLOCK_M"]))
        many = dim("rows", bm * (2 * target.backend.max_programs("vector") + 1), entry.shape_when)
        one, chunked = _widths(entry.config, entry.shape_when)
        for cls in entry.classes:
            dtype = getattr(torch, cls["dtype"])
            # a sum's dtype is torch's promotion of x's and the residual's: an fp32 sum may come
            # from a bf16 x and an fp32 residual (d(x) and d(residual) then written apart)
            mixed = dtype == torch.float32
            x_dtype = torch.bfloat16 if mixed else dtype
            forms = [("d(x, w, b) from s, with d(s)", dict(HAS_S=True, HAS_RES=False, HAS_DS=True, STORE_X=True,
                                                          STORE_R=False, NEED_DW=True, NEED_DB=layer)),
                     (f"x + r recomputed{', bf16 x, d(r) fp32' if mixed else ''}, no d(s)",
                      dict(HAS_S=False, HAS_RES=True, HAS_DS=False, STORE_X=True, STORE_R=mixed, NEED_DW=True,
                           NEED_DB=layer)),
                     ("d(x) only", dict(HAS_S=True, HAS_RES=False, HAS_DS=True, STORE_X=True, STORE_R=False,
                                        NEED_DW=False, NEED_DB=False))]
            for width, path in ((one, "one pass"), (chunked, "chunked")):
                if width is None:
                    continue
                big = dim("rows", 2**31 // width + 2 * bm, entry.shape_when)
                for i, (what, flags) in enumerate(forms + [(forms[0][0] + ", rows x N past 2**31", forms[0][1])]):
                    rows = big if i == len(forms) else many
                    shape = torch.Size((rows, width))
                    strides = {k: width for k in ("s", "x", "residual", "dy", "ds", "dx", "dr")}
                    plan = BwdPlan(target.backend, dev, op.kind, shape, dtype, strides,
                                   dict(flags, HAS_W=True), dict(entry.config), entry.where)
                    t = lambda dt=dtype: meta((rows, width), dt)  # noqa: E731
                    part = meta((plan.programs, plan.n_part, width), torch.float32) if plan.n_part else None
                    f = meta((4,), torch.float32)
                    xd = x_dtype if flags["HAS_RES"] else dtype  # d(x) in x's dtype
                    args = (t() if flags["HAS_S"] else f, t(xd) if flags["HAS_RES"] else f,
                            t() if flags["HAS_RES"] else f, t(), t() if flags["HAS_DS"] else f,
                            meta((width,), dtype), meta((rows,), torch.float32) if layer else f,
                            meta((rows,), torch.float32), t(xd), t() if flags["STORE_R"] else f,
                            f if part is None else part, *plan.tail, 0.0, plan.db_at, plan.n_part * width,
                            plan.tiles, plan.programs)
                    c = plan.constexprs
                    tags = "".join(f" {k.lower()}" for k in ("ONE_CHUNK", "INDEX_64") if c[k])
                    label = f"{path}, {what}"
                    yield target.case(op.name, K.add_norm_bwd_kernel, args, c, cls["dtype"],
                                      f"backward {c['BLOCK_M']}x{c['BLOCK_N']} programs {plan.programs}{tags}|"
                                      f"{label}|{entry.where}")
                    if i != 0 or part is None:
                        continue
                    for pdt in dict.fromkeys((dtype, torch.float32)):
                        launcher, _, (blocks, nprog) = plan.summer(pdt, pdt if layer else None)
                        gw, gb = meta((width,), pdt), meta((width,), pdt) if layer else part
                        sargs = (part, gw, gb, plan.programs, width, plan.db_at, plan.n_part * width, blocks, nprog)
                        sc = launcher.constexprs
                        yield target.case(op.name, K.part_sum_kernel, sargs, sc, cls["dtype"],
                                          f"part sum {sc['BLOCK_P']}x{sc['BLOCK_N']} programs {nprog}|"
                                          f"{label}, parameters {str(pdt).removeprefix('torch.')}|{entry.where}")


def _forward_cases(op: Any, target: CompileTarget) -> Iterator[CompileCase]:
    for entry in add_norm_entries(op, target):
        for cls in entry.classes:
            dtype = getattr(torch, cls["dtype"])
            for label, c in add_norm_layouts(op, target, entry.config, entry.shape_when, dtype):
                rows, n = c["rows"], c["n"]
                pdt = c.get("param_dtype", dtype)
                x = meta((rows, n), c.get("x_dtype", dtype))
                r = meta((rows, n), dtype) if c["residual"] else None
                w = meta((n,), pdt) if c["weight"] else None
                b = meta((n,), pdt) if c["bias"] else None
                if op.kind == "layer":
                    call = op.check(x, r, w, b, 1e-5, return_sum=c["return_sum"])
                else:
                    call = op.check(x, r, w, 1e-6, offset=c.get("offset", 0.0), return_sum=c["return_sum"])
                call.store_stats = c["stats"]
                with tuning.force(entry.config):
                    plan = op.make_plan(call, target.backend)
                y = meta((rows, n), dtype)
                s = meta((rows, n), dtype) if call.store_sum else None
                mean = meta((rows,), torch.float32) if call.store_stats and op.kind == "layer" else None
                rstd = meta((rows,), torch.float32) if call.store_stats else None
                rt = plan.args(call, x, r, y, s, mean, rstd)
                idx = " int64-index" if plan.constexprs["INDEX_64"] else ""
                loop = " persistent" if plan.constexprs["PERSISTENT"] else ""
                yield target.case(op.name, plan.jit_fn, rt, plan.constexprs, cls["dtype"],
                                  f"{shown(plan.config)}|{label}{loop}{idx}|{entry.where}")
