"""Training's ``norm(x + residual)`` inside a ``torch.compile`` graph: forward and backward launched
as user-defined Triton kernels.

Under compile a patched block used to trace its class's own forward, which Inductor turns into
one fused add + norm kernel forward and, backward, one kernel for the input gradient with partial
sums of the weight and bias gradients (its "mix order reduction"), whose partials its wrapper then
adds with one PyTorch ``sum`` per parameter (results/2026-12-03-h200-compiled-training-split).
Here the traced code launches xkernels' own kernels, as eager training runs them
(``add_norm_kernels``: ``add_norm_kernel`` writes y, the sum and the row statistics;
``add_norm_bwd_kernel`` reads the sum, dy and the sum's own gradient once and writes d(x) with the
per-program partials of d(w) and d(b); ``part_sum_kernel`` adds those in one launch): Dynamo
records each as a user-defined Triton kernel inside :class:`CompiledAddNorm` (an autograd
Function it traces forward and backward), and Inductor calls them from its generated code, with
no custom op's Python at run time.

The launches are decided while Dynamo traces, by functions it calls instead of tracing
(:func:`forward_launch`, :func:`backward_launch`: constants of the graph, as shapes and dtypes
are), from the plans eager mode makes for the same call. The form is used where

* a gradient is required (inference keeps the class's forward: Inductor's one fused forward
  kernel moves the bytes xkernels' does);
* the add_norm table has a measured ``"pass": "compiled"`` rule for the call's norm, dtype, width
  and rows whose config says ``"compiled": "kernels"`` and whose ``worst_ratio`` (kernel time of
  this form's forward + backward over Inductor's, ``tools/probes/norm_backward_compiled.py``) is
  at least :data:`MIN_RATIO`; no rule (other GPUs, the NPU, shapes not measured) keeps Inductor's
  (where the device's arch has no compiled rule at all, :func:`available` says so and the block
  traces its class's forward, as before the form existed);
* x and residual are contiguous, of one shape and one dtype, which the weight and bias share,
  every dim static, the kernels launchable from Inductor's code (the backend's launchable form of
  a kernel is the ``@triton.jit`` function itself), the backward's route the kernel, no forced
  tuning config.

Elsewhere :func:`add_norm` answers ``None`` and the caller traces the class's own forward.
Gradients are eager training's (the same kernels and plans); double backward is not supported.

**Dropout.** ``add_norm(..., dropout=p)`` computes ``norm(dropout(x, p) + residual)``, the
post-norm block of BERT and its descendants in training (``LayerNorm(dropout(dense(h)) + input)``),
with ``add_norm_dropout_kernel`` / ``add_norm_dropout_bwd_kernel``: the same kernels with a
Philox-4x32 keep mask (one draw per four elements) from an int64 seed that ``torch.randint`` draws from
torch's generator for each call (so ``torch.manual_seed`` makes a run repeat, and a compiled graph
draws a new seed at every call, as Inductor's own dropout does), never stored: the backward draws
it again from the seed it saved. The mask is not torch's eager dropout's (nor Inductor's): each
element is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)``, as theirs are. Its
rules are the table's ``"pass": "compiled_dropout"`` ones, measured with dropout against
Inductor's own dropout + add + norm.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

from xkernels import dispatch, tuning

#: the measured speedup over Inductor's add + norm forward + backward a rule needs: the three
#: launches are Inductor's own kind (user-defined Triton kernels from its wrapper), so only a
#: margin against measurement spread
MIN_RATIO = 1.05


class Launch(NamedTuple):
    """One kernel launch: grid, constexprs, launch options and the runtime scalars that follow its
    tensor arguments (the kernel itself is named where it is launched: Dynamo records the launch
    of a module's ``@triton.jit`` function)."""

    grid: int
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    scalars: tuple[Any, ...]



class ForwardSpec(NamedTuple):
    launch: Launch  # add_norm_kernel; its scalars end before eps, offset (passed per call)
    n_tiles: int
    variant: str


class BackwardSpec(NamedTuple):
    launch: Launch  # add_norm_bwd_kernel; scalars: R, N, the seven row strides (offset follows per call)
    tail: tuple[int, int, int, int]  # db_at, part_row, tiles, programs
    part: tuple[int, int, int] | None  # the fp32 partials' shape; None without d(w)/d(b)
    zero_part: bool  # chunked rows add into the partials atomically: zeroed first
    sums: Launch | None  # part_sum_kernel; scalars: P, N, db_at, part_row, blocks, programs


def _backend(device: torch.device) -> Any:
    try:
        backend = dispatch.select(device)
    except Exception:  # noqa: BLE001 - no backend for this device: the class's own forward
        return None
    return backend if backend.runs_triton else None


def available(device: torch.device, dropout: bool = False) -> bool:
    """Whether a compiled training call on ``device`` may take this form: its backend runs Triton
    and its add_norm tables hold a ``"pass": "compiled"`` rule (``"compiled_dropout"`` for a call
    with dropout) for the device's arch (a rule decides per call). Elsewhere a patched block traces
    its class's forward as before. A Dynamo constant."""
    return _available(device, dropout, dispatch.override_name())


available._dynamo_marked_constant = True  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=64)
def _available(device: torch.device, dropout: bool, override: str | None) -> bool:
    backend = _backend(device)
    wanted = _pass(dropout)
    return backend is not None and any(
        r.get("when", {}).get("pass") == wanted and r.get("config", {}).get("compiled") == "kernels"
        for r in tuning.rules("add_norm", backend, backend.arch(device)))


def _pass(dropout: bool) -> str:
    """The ``"pass"`` of the rules for a call with or without dropout."""
    return "compiled_dropout" if dropout else "compiled"


def rule(kind: str, rows: int, n: int, dtype: torch.dtype, device: torch.device, dropout: bool = False) -> Any:
    """The add_norm table's measured ``"pass": "compiled"`` (``"compiled_dropout"``) choice for
    this call, or ``None``."""
    backend = _backend(device)
    if backend is None:
        return None
    key = {"pass": _pass(dropout), "norm": kind, "dtype": str(dtype).removeprefix("torch."), "n": n, "rows": rows}
    choice = tuning.lookup("add_norm", backend, backend.arch(device), key, {}, rules_only=True)
    if choice is None or not choice.measured or choice.config.get("compiled") != "kernels":
        return None
    ratio = choice.record.get("worst_ratio")
    return choice if isinstance(ratio, int | float) and ratio >= MIN_RATIO else None


def forward_launch(kind: str, rows: int, n: int, dtype: torch.dtype, device: torch.device, has_residual: bool,
                   has_weight: bool, has_bias: bool, dropout: bool = False) -> ForwardSpec | None:
    """The forward's launch (y, the sum and the statistics written) for contiguous (rows, n)
    operands, or ``None`` where the class's own forward is traced (module doc). ``dropout``: x is
    dropped before the add (``add_norm_dropout_kernel``, same configuration). A Dynamo constant:
    called, not traced."""
    if tuning.forced_config() is not None or (dropout and not has_residual):
        return None
    return _forward(kind, rows, n, dtype, device, has_residual, has_weight, has_bias, dropout,
                    dispatch.override_name())


forward_launch._dynamo_marked_constant = True  # type: ignore[attr-defined]  # as ops/matmul/compiled.py's


@functools.lru_cache(maxsize=256)
def _forward(kind: str, rows: int, n: int, dtype: torch.dtype, device: torch.device, has_residual: bool,
             has_weight: bool, has_bias: bool, dropout: bool, override: str | None) -> ForwardSpec | None:
    from xkernels.ops.fused import add_norm_bwd as bwd
    from xkernels.ops.fused.add_norm_plan import KERNEL_DTYPES, AddNormCall, AddNormPlan

    if rows == 0 or n == 0 or dtype not in KERNEL_DTYPES or rule(kind, rows, n, dtype, device, dropout) is None:
        return None
    backend = _backend(device)
    if bwd.route(backend, device, kind, dtype, torch.Size((rows, n)), (dtype,) * 4) != "kernel":
        return None
    meta = torch.empty((rows, n), dtype=dtype, device="meta")
    vec = torch.empty((n,), dtype=dtype, device="meta")
    call = AddNormCall("add_layer_norm" if kind == "layer" else "add_rms_norm", kind, meta,
                       meta if has_residual else None, vec if has_weight else None, vec if has_bias else None,
                       0.0, 0.0, True, dtype, device, True, store_sum=True, store_stats=True)
    plan = AddNormPlan(backend, call)
    if plan.copies or not _launchable(plan.launcher.kernel):
        return None
    return ForwardSpec(Launch(plan.grid[0], tuple(plan.constexprs.items()), tuple(plan.options.items()),
                              plan.tail), plan.n_tiles, plan.variant)


def _launchable(kernel: Any) -> bool:
    """Whether Inductor can call ``kernel`` from its code: a ``@triton.jit`` function (not the
    interpreter's, nor a backend's wrapper)."""
    from triton.runtime.jit import JITFunction

    return isinstance(kernel, JITFunction)


def backward_launch(kind: str, rows: int, n: int, dtype: torch.dtype, device: torch.device, has_weight: bool,
                    has_ds: bool, needs: tuple[bool, bool, bool, bool], has_bias: bool,
                    dropout: bool = False) -> BackwardSpec:
    """The backward's launches for the forward :func:`forward_launch` planned: ``needs`` says
    which of d(x), d(residual), d(weight), d(bias) are required; d(x) serves the residual too
    (one shape, one dtype), except after a dropout, where d(x) is the dropout's backward of
    d(residual) and both are written. A Dynamo constant, as :func:`forward_launch`."""
    return _backward(kind, rows, n, dtype, device, has_weight, has_ds, needs, has_bias, dropout,
                     dispatch.override_name())


backward_launch._dynamo_marked_constant = True  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=256)
def _backward(kind: str, rows: int, n: int, dtype: torch.dtype, device: torch.device, has_weight: bool,
              has_ds: bool, needs: tuple[bool, bool, bool, bool], has_bias: bool, dropout: bool,
              override: str | None) -> BackwardSpec:
    from xkernels.ops.fused import add_norm_bwd as bwd

    backend = _backend(device)
    store_x, store_r = (needs[0], needs[1]) if dropout else (needs[0] or needs[1], False)
    flags = dict(HAS_S=True, HAS_RES=False, HAS_W=has_weight, HAS_DS=has_ds, STORE_X=store_x, STORE_R=store_r,
                 NEED_DW=needs[2] and has_weight, NEED_DB=needs[3] and has_bias)
    strides = {"s": n, "x": 0, "residual": 0, "dy": n, "ds": n, "dx": n, "dr": n}
    config, source = bwd._lookup(backend, device, kind, dtype, n, rows)
    plan = bwd.BwdPlan(backend, device, kind, torch.Size((rows, n)), dtype, strides, flags, config, source)
    main = Launch(plan.grid[0], tuple(plan.constexprs.items()), tuple(plan.options.items()),
                  plan.tail)
    tail = (plan.db_at, plan.n_part * n, plan.tiles, plan.programs)
    if not plan.n_part:
        return BackwardSpec(main, tail, None, False, None)
    launcher, _, (blocks, programs) = plan.summer(dtype if flags["NEED_DW"] else None,
                                                   dtype if flags["NEED_DB"] else None)
    sums = Launch(launcher.grid[0], tuple(launcher.constexprs.items()),
                  tuple(launcher.options.items()), (plan.programs, n, plan.db_at, plan.n_part * n, blocks, programs))
    return BackwardSpec(main, tail, (plan.programs, plan.n_part, n), not plan.one_chunk, sums)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer the form's kernels write (one place, so tests can poison them)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _seed(device: torch.device) -> torch.Tensor:
    """A dropout call's Philox seed: one int64 drawn from torch's generator for ``device`` (a
    tensor on the device, so that a captured or compiled graph draws a new one per call)."""
    return torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, device=device)


class CompiledAddNorm(torch.autograd.Function):
    """``(y, s)`` of ``norm(dropout(x, p) + residual)`` (no dropout where ``p`` is 0) over
    contiguous (rows, n) operands by :func:`forward_launch`'s launch, or ``y`` alone where the
    caller drops the sum (no gradient of it is then materialized for the backward to read); the
    backward by :func:`backward_launch`'s."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                bias: torch.Tensor | None, kind: str, eps: float, offset: float,
                keep_sum: bool, p: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        from xkernels.ops.fused import add_norm_kernels as K

        rows, n = x.shape[0], x.shape[1]
        spec = forward_launch(kind, rows, n, x.dtype, x.device, residual is not None, weight is not None,
                              bias is not None, p > 0)
        y = _empty((rows, n), x.dtype, x.device)
        s = _empty((rows, n), x.dtype, x.device)
        rstd = _empty((rows,), torch.float32, x.device)
        mean = _empty((rows,), torch.float32, x.device) if kind == "layer" else rstd
        fwd = spec.launch
        r = x if residual is None else residual
        w = y if weight is None else weight
        b = y if bias is None else bias
        if p > 0:
            seed = _seed(x.device)
            R, N, sx, sr, ss, sy = fwd.scalars
            K.add_norm_dropout_kernel[(fwd.grid,)](x, r, w, b, s, y, mean, rstd, seed, R, N, sx, sr, ss, sy, eps,
                                                   offset or -0.0, p, spec.n_tiles, fwd.grid, **dict(fwd.constexprs),
                                                   **dict(fwd.options))
        else:
            seed = rstd  # no dropout: nothing drawn, nothing read
            K.add_norm_kernel[(fwd.grid,)](x, r, w, b, s, y, mean, rstd, *fwd.scalars, eps, offset or -0.0,
                                           spec.n_tiles, fwd.grid, **dict(fwd.constexprs), **dict(fwd.options))
        ctx.save_for_backward(s, mean, rstd, weight, seed)
        ctx.norm = (kind, offset, bias is not None, p)
        return (y, s) if keep_sum else y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor | None, ds: torch.Tensor | None = None) -> tuple[Any, ...]:
        from xkernels.ops.fused import add_norm_kernels as K

        s, mean, rstd, weight, seed = ctx.saved_tensors
        kind, offset, has_bias, p = ctx.norm
        if dy is None:
            dy = torch.zeros_like(s)
        rows, n = s.shape[0], s.shape[1]
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2], ctx.needs_input_grad[3])
        spec = backward_launch(kind, rows, n, s.dtype, s.device, weight is not None, ds is not None, needs, has_bias,
                               p > 0)
        if p > 0:
            return _dropout_backward(spec, s, mean, rstd, weight, seed, dy, ds, offset, p, needs, has_bias)
        dx = _empty((rows, n), s.dtype, s.device) if needs[0] or needs[1] else None
        part = _partials(spec, s.device)
        f = rstd  # absent operands: never read or written (constexpr flags)
        bwd = spec.launch
        K.add_norm_bwd_kernel[(bwd.grid,)](s, f, f, dy.contiguous(), f if ds is None else ds.contiguous(),
                                           f if weight is None else weight, mean, rstd, f if dx is None else dx, f,
                                           f if part is None else part, *bwd.scalars, offset, *spec.tail,
                                           **dict(bwd.constexprs), **dict(bwd.options))
        dw, db = _parameter_sums(spec, part, s, weight, needs, has_bias)
        return dx if needs[0] else None, dx if needs[1] else None, dw, db, None, None, None, None, None


def _partials(spec: BackwardSpec, device: torch.device) -> torch.Tensor | None:
    """The backward's fp32 d(w)/d(b) partials (zeroed where chunked rows add into them atomically)."""
    if spec.part is None:
        return None
    if spec.zero_part:
        return torch.zeros(spec.part, dtype=torch.float32, device=device)
    return _empty(spec.part, torch.float32, device)


def _parameter_sums(spec: BackwardSpec, part: torch.Tensor | None, s: torch.Tensor, weight: torch.Tensor | None,
                    needs: tuple[bool, bool, bool, bool], has_bias: bool) -> tuple[Any, Any]:
    """d(w), d(b) from the partials (``part_sum_kernel``), ``None`` where not required."""
    from xkernels.ops.fused import add_norm_kernels as K

    if spec.sums is None:
        return None, None
    n = s.shape[1]
    dw = _empty((n,), s.dtype, s.device) if needs[2] and weight is not None else None
    db = _empty((n,), s.dtype, s.device) if needs[3] and has_bias else None
    sums = spec.sums
    K.part_sum_kernel[(sums.grid,)](part, part if dw is None else dw, part if db is None else db,
                                    *sums.scalars, **dict(sums.constexprs), **dict(sums.options))
    return dw, db


def _dropout_backward(spec: BackwardSpec, s: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                      weight: torch.Tensor | None, seed: torch.Tensor, dy: torch.Tensor, ds: torch.Tensor | None,
                      offset: float, p: float, needs: tuple[bool, bool, bool, bool], has_bias: bool) -> tuple[Any, ...]:
    """:class:`CompiledAddNorm`'s backward after a dropout: d(residual) = d(s), d(x) the dropout's
    backward of it (the forward's mask, drawn again from ``seed``), each written where required."""
    from xkernels.ops.fused import add_norm_kernels as K

    rows, n = s.shape[0], s.shape[1]
    dx = _empty((rows, n), s.dtype, s.device) if needs[0] else None
    dr = _empty((rows, n), s.dtype, s.device) if needs[1] else None
    part = _partials(spec, s.device)
    f = rstd  # absent operands: never read or written (constexpr flags)
    bwd = spec.launch
    K.add_norm_dropout_bwd_kernel[(bwd.grid,)](s, f, f, dy.contiguous(), f if ds is None else ds.contiguous(),
                                               f if weight is None else weight, mean, rstd, f if dx is None else dx,
                                               f if dr is None else dr, f if part is None else part, seed,
                                               *bwd.scalars, offset, p, *spec.tail, **dict(bwd.constexprs),
                                               **dict(bwd.options))
    dw, db = _parameter_sums(spec, part, s, weight, needs, has_bias)
    return dx, dr, dw, db, None, None, None, None, None


def _plain(t: torch.Tensor | None, x: torch.Tensor, dims: int) -> bool:
    return t is None or (t.dim() == dims and t.is_contiguous() and t.dtype == x.dtype and t.device == x.device)


def add_norm(kind: str, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
             bias: torch.Tensor | None, eps: float, offset: float, return_sum: bool, dropout: float = 0.0) -> Any:
    """``norm(x + residual)`` (and the sum, where ``return_sum``) of a training call as the
    compiled form's launches in the graph being traced, or ``None`` where the caller should trace
    the class's own forward (the module doc); ``dropout`` (``0 <= p < 1``): ``x`` dropped with
    that probability before the add, which needs a residual. Called while Dynamo traces."""
    if not 0.0 <= dropout < 1.0 or (dropout and residual is None):
        return None
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (x, residual, weight, bias)):
        return None
    if x.dim() < 2 or not all(isinstance(d, int) for d in x.shape) or not _plain(x, x, x.dim()):
        return None
    if residual is not None and (residual.shape != x.shape or not _plain(residual, x, x.dim())):
        return None
    n = x.shape[-1]
    if not (_plain(weight, x, 1) and _plain(bias, x, 1)) or any(t is not None and t.shape[0] != n
                                                                 for t in (weight, bias)):
        return None
    rows = x.numel() // n if n else 0
    spec = forward_launch(kind, rows, n, x.dtype, x.device, residual is not None, weight is not None,
                          bias is not None, dropout > 0)
    if spec is None:
        return None
    shape = x.shape
    out = CompiledAddNorm.apply(x.view(rows, n), None if residual is None else residual.view(rows, n), weight,
                                bias, kind, float(eps), float(offset), return_sum, float(dropout))
    return (out[0].view(shape), out[1].view(shape)) if return_sum else out.view(shape)
