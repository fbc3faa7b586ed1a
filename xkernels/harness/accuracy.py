"""Accuracy check of one case: run the op on the target, compare with a float64 PyTorch reference.

For each case: fresh random inputs; ``out=`` poisoned first (NaN, or the dtype's most negative
value for ints) unless it is an input (in place); the reference computed by PyTorch on the CPU
in float64 (ints in int64) from clones of the inputs and cast back to the result dtype; after the
call: result shape/dtype/identity with ``out``, no NaN/sentinel left where the reference has a
number, inputs bit-identical to their clones, every element within :mod:`tolerances`.

:func:`run_checks` first compares each case's estimated peak memory with what the device and
the host have free (:mod:`memory`); a case that does not fit is skipped with the reason, as is
one whose inputs or reference run out of memory anyway (an out-of-memory error of the op call
itself is a failure).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from xkernels.backend import Backend
from xkernels.dispatch import use_backend
from xkernels.harness import memory, tolerances
from xkernels.harness.case import Case, Inputs, expected_result
from xkernels.harness.torch_ops import OPS

CHUNK = 1 << 24  # elements compared at a time


@dataclass
class CheckResult:
    """The outcome of one case; ``message`` says why it failed or was skipped (empty on a pass)."""

    case: Case
    passed: bool
    max_abs: float
    max_rel: float
    tolerance: str
    message: str = ""
    seconds: float = 0.0
    skipped: bool = False  # not run: not enough free memory (``message`` says how much it needs)

    def as_dict(self) -> dict[str, Any]:
        c = self.case
        return {"op": c.op, "dtype": str(c.dtype).removeprefix("torch."), "shape": c.shape_label,
                "layout": c.layout, "max_abs_err": self.max_abs, "max_rel_err": self.max_rel,
                "tolerance": self.tolerance, "passed": self.passed, "skipped": self.skipped,
                "message": self.message, "seconds": round(self.seconds, 4)}


def op_function(op: str) -> Callable[..., Any]:
    """``xkernels.ops.<op>``; NotImplementedError (a failure, never a skip) if it does not exist."""
    import xkernels.ops

    fn = getattr(xkernels.ops, op, None)
    if fn is None:
        raise NotImplementedError(f"xkernels.ops.{op} is not implemented")
    return fn


def sentinel(dtype: torch.dtype) -> float | int:
    """The value ``out=`` is poisoned with: NaN for floats, the most negative value for ints."""
    return float("nan") if dtype.is_floating_point else int(torch.iinfo(dtype).min)


def _poisoned(t: torch.Tensor) -> torch.Tensor:
    """Where ``t`` still holds the poison value."""
    if t.dtype.is_floating_point:
        return torch.isnan(t)
    return t == sentinel(t.dtype)


def _activation(op: str, inputs: Inputs) -> str | None:
    if op == "gated_linear":
        return inputs.args[5] if len(inputs.args) > 5 else inputs.kwargs.get("activation", "silu")
    if op != "linear":
        return None
    return inputs.args[3] if len(inputs.args) > 3 else inputs.kwargs.get("activation")


def reference(op: str, inputs: Inputs, dtype: torch.dtype,
              on: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(float64/int64 reference on ``on`` (the CPU unless asked), ``|A|@|B|`` magnitude for
    matmul-like ops, K)."""
    wide = torch.float64 if dtype.is_floating_point else torch.int64

    def up(v: Any) -> Any:
        return v.detach().to(on, wide) if isinstance(v, torch.Tensor) else v

    spec = OPS[op]
    args = [up(a) for a in inputs.args]
    if not any(isinstance(a, torch.Tensor) for a in args):  # Python numbers only (add(2.5, 3)): widen one
        args[0] = torch.tensor(args[0], dtype=wide)
    kwargs = {k: up(v) for k, v in inputs.kwargs.items() if k != "out"}
    if spec.reference is not None:  # tuples for ops with several outputs
        return spec.reference(dtype, *args, **kwargs)
    ref = spec.torch_fn(*args, **kwargs)
    if not spec.matmul_like:
        return ref, None, 0
    k = args[0].shape[-1]
    if op == "gated_linear":
        return ref, _gated_magnitude(args, kwargs), k
    abs_args = [a.abs() if isinstance(a, torch.Tensor) else a for a in args]
    if op == "linear":  # |x| @ |w|.T + |bias|, no activation
        abs_args = abs_args[:3]
        kwargs = {"bias": kwargs["bias"].abs()} if "bias" in kwargs else {}
    mag = spec.torch_fn(*abs_args, **kwargs)
    if op == "linear" and _activation(op, inputs) == "relu2":  # slope 2 relu(h) <= 2 mag: the error scales by it
        mag = 2 * mag * mag
    return ref, mag, k


def _gated_magnitude(args: list[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    """The magnitude a gated_linear result's rounding error is proportional to: an error e_g in
    the gate's inner product moves the result by at most L * |up| * e_g, one e_u in up's by
    |act(gate)| * e_u, each e bounded by the dot coefficient times ``|x| @ |W|.T + |b|``, so
    ``|up| * mag_gate + |act(gate)| * mag_up`` (L, the activation's slope, is in the coefficient;
    relu2's slope 2 relu(gate) <= 2 mag_gate is carried here, as for linear)."""
    from xkernels.ops.matmul.vendor import activate

    names = ("x", "weight", "up_weight", "bias", "up_bias", "activation")
    call = {**dict(zip(names, args)), **kwargs}
    x, w, uw, b, ub = (call.get(n) for n in names[:5])
    F = torch.nn.functional
    if uw is None:
        n = w.shape[0] // 2
        w, uw = w[:n], w[n:]
        b, ub = (None, None) if b is None else (b[:n], b[n:])
    gate, up = F.linear(x, w, b), F.linear(x, uw, ub)
    mag_g = F.linear(x.abs(), w.abs(), None if b is None else b.abs())
    mag_u = F.linear(x.abs(), uw.abs(), None if ub is None else ub.abs())
    activation = call.get("activation", "silu")
    slope = 2 * mag_g if activation == "relu2" else 1.0
    return up.abs() * mag_g * slope + activate(gate, activation).abs() * mag_u


def _clone(v: Any) -> Any:
    return v.clone() if isinstance(v, torch.Tensor) else v


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def check_case(case: Case, backend: Backend, device: torch.device, seed: int) -> CheckResult:
    """Run ``case`` once on ``backend``/``device`` and judge the result."""
    start = time.perf_counter()
    spec = OPS[case.op]
    inputs = case.make_inputs(device, seed)
    expected = expected_result(case.op, inputs)
    # (y, s) of the fused norms, (q_embed, k_embed) of rotary_embedding
    wanted = list(expected) if isinstance(expected, tuple) else [expected]
    tol = tolerances.tolerance(case.op, wanted[0].dtype, backend)

    out = inputs.out
    named = inputs.named_tensors(spec.arg_names)
    in_place = out is not None and any(_same_view(out, t) for t in named.values())
    if out is not None and not in_place:
        out.fill_(sentinel(out.dtype))
    clones = Inputs(tuple(_clone(a) for a in inputs.args),
                    {k: _clone(v) for k, v in inputs.kwargs.items() if k != "out"})
    saved = clones.named_tensors(spec.arg_names)
    ref64, mag, k = reference(case.op, clones, wanted[0].dtype)
    activation = _activation(case.op, inputs)
    residual = case.op == "linear" and inputs.kwargs.get("residual") is not None
    tol_text = tol.describe(k if mag is not None else None, activation, residual, spec.magnitude)

    def fail(msg: str, max_abs: float = float("nan"), max_rel: float = float("nan")) -> CheckResult:
        return CheckResult(case, False, max_abs, max_rel, tol_text, msg, time.perf_counter() - start)

    try:
        fn = op_function(case.op)
        with use_backend(backend.name):
            result = fn(*inputs.args, **inputs.kwargs)
        backend.synchronize(device)
    except Exception as exc:  # a crash is a failed case, reported with the rest
        first = (str(exc).strip().splitlines() or [""])[0]
        return fail(f"raised {type(exc).__name__}: {first}")

    results = list(result) if isinstance(result, tuple) and isinstance(expected, tuple) else [result]
    if len(results) != len(wanted) or not all(isinstance(r, torch.Tensor) for r in results):
        what = f"a tuple of {len(results)}" if isinstance(result, tuple) else type(result).__name__
        return fail(f"returned {what}, not {'a tensor' if len(wanted) == 1 else f'{len(wanted)} tensors'}")
    for got, exp in zip(results, wanted):
        if tuple(got.shape) != tuple(exp.shape) or got.dtype != exp.dtype:
            return fail(f"returned {tuple(got.shape)} {got.dtype}, PyTorch gives {tuple(exp.shape)} {exp.dtype}")
        # with Python numbers only and no out=, PyTorch's result is on the CPU whatever the device
        want = torch.device(device) if named or out is not None else exp.device
        if (got.device.type, got.device.index if want.index is not None else None) != (want.type, want.index):
            return fail(f"returned a tensor on {got.device}, not {device}")
    if out is not None and not _same_view(result, out):
        return fail("did not return the out= tensor")
    for name, before in saved.items():
        if not (in_place and _same_view(named[name], out)) and not torch.equal(named[name], before):
            return fail(f"modified its input '{name}'")

    refs = list(ref64) if len(wanted) > 1 else [ref64]
    mags = list(mag) if len(wanted) > 1 else [mag]
    max_abs = max_rel = 0.0
    for i, (got, exp, ref, m) in enumerate(zip(results, wanted, refs, mags)):
        # a second output without a magnitude (the fused norms' sum s) is element-wise; one with
        # its own (rotary's k_embed) has the op's tolerance, as the first
        t = tol if i == 0 or m is not None else tolerances.ELEMENTWISE[exp.dtype]
        cmp = compare(got.detach().cpu(), ref.to(exp.dtype), m, t,
                      t.dot_coefficient(k, activation, residual) if m is not None else 0.0, exact=ref)
        max_abs, max_rel = _nanmax(max_abs, cmp.max_abs), _nanmax(max_rel, cmp.max_rel)
        which = f"output {i}: " if len(wanted) > 1 else ""
        if cmp.left:
            what = "NaN" if exp.dtype.is_floating_point else "sentinel"
            return fail(f"{which}{cmp.left} of {got.numel()} elements still {what} (never written?)", max_abs,
                        max_rel)
        if cmp.bad:
            idx, g, w = cmp.first_bad
            at = tuple(int(j) for j in torch.unravel_index(torch.tensor(idx), tuple(got.shape))) if got.dim() else ()
            return fail(f"{which}{cmp.bad} of {got.numel()} elements outside tolerance; first at {at}: "
                        f"got {g:.6g}, want {w:.6g}", max_abs, max_rel)
    return CheckResult(case, True, max_abs, max_rel, tol_text, "", time.perf_counter() - start)


@dataclass
class Comparison:
    """Element-wise comparison of a result with its reference."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    left: int = 0  # poison left where the reference has a number
    bad: int = 0  # elements outside the tolerance
    first_bad: tuple[int, float, float] | None = None  # (flat index, got, want)


def _nanmax(a: float, b: float) -> float:
    return a if math.isnan(a) else b if math.isnan(b) else max(a, b)


def _overflow_threshold(dtype: torch.dtype) -> float:
    """The smallest magnitude that rounds to infinity in ``dtype`` (its largest finite value plus
    half a unit in the last place there): 65520 for float16."""
    fi = torch.finfo(dtype)
    top = 2.0 ** (math.frexp(float(fi.max))[1] - 1)  # the start of the last binade
    return float(fi.max) + top * fi.eps / 2


def compare(got: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor | None, tol: tolerances.Tolerance,
            dot: float, exact: torch.Tensor | None = None) -> Comparison:
    """Compare ``got`` with ``ref`` (same shape and dtype, on the CPU) in float64, in chunks so that
    a billion-element result needs no more than a few chunk-sized temporaries. ``exact``: the
    reference before its rounding to ``ref``'s dtype; where given, a result that overflowed to
    +-inf where ``ref`` is finite counts as the overflow threshold (the least it can have been) and
    is compared with the exact value: a value within tolerance of the dtype's range may round
    either side of it."""
    c = Comparison()
    flat_g, flat_r = got.reshape(-1), ref.reshape(-1)
    flat_m = mag.reshape(-1) if mag is not None else None
    flat_x = exact.reshape(-1) if exact is not None and got.dtype.is_floating_point else None
    for lo in range(0, flat_g.numel(), CHUNK):
        gc, rc = flat_g[lo:lo + CHUNK], flat_r[lo:lo + CHUNK]
        c.left += int((_poisoned(gc) & ~_poisoned(rc)).sum())
        g, r = gc.double(), rc.double()
        if flat_x is not None:
            over = torch.isinf(g) & torch.isfinite(r)
            if over.any():
                g, r = g.clone(), r.clone()
                g[over] = g[over].sign() * _overflow_threshold(got.dtype)
                r[over] = flat_x[lo:lo + CHUNK].double()[over]
        err = (g - r).abs()
        err[g == r] = 0  # equal infinities
        c.max_abs = _nanmax(c.max_abs, err.max().item())
        nonzero = r != 0
        if nonzero.any():
            c.max_rel = _nanmax(c.max_rel, (err[nonzero] / r[nonzero].abs()).max().item())
        allowed = tol.atol + tol.rtol * r.abs()
        if flat_m is not None:
            allowed += dot * flat_m[lo:lo + CHUNK]
        bad = ~(err <= allowed)
        n_bad = int(bad.sum())
        if n_bad and c.first_bad is None:
            i = int(bad.nonzero()[0])
            c.first_bad = (lo + i, g[i].item(), r[i].item())
        c.bad += n_bad
    return c


def _is_out_of_memory(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    text = str(exc).lower()
    return isinstance(exc, (MemoryError, oom)) or (
        isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))


def skipped(case: Case, why: str) -> CheckResult:
    """The result of a case that was not run, and why."""
    return CheckResult(case, False, float("nan"), float("nan"), "", f"skipped: {why}", skipped=True)


def run_checks(cases: Iterable[Case], backend: Backend, device: torch.device, seed: int,
               on_result: Callable[[CheckResult], None] | None = None,
               max_memory: int | None = None) -> list[CheckResult]:
    """Check every case in order; ``on_result`` sees each result as it comes. A case whose
    estimated peak does not fit the free memory (or ``max_memory`` bytes per pool) is skipped."""
    results = []
    for case in cases:
        need = memory.footprint(case, device, CHUNK)
        free = memory.free_memory(device)
        why = memory.does_not_fit(need, free, max_memory)
        if why is not None:
            res = skipped(case, why)
        else:
            try:
                res = check_case(case, backend, device, seed)
            except Exception as exc:
                if not _is_out_of_memory(exc):
                    raise
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                res = skipped(case, f"ran out of memory building its inputs or reference ({first}); "
                                    f"estimated ~{memory.gib(need.host)} host, ~{memory.gib(need.device)} device; {free}")
        results.append(res)
        if on_result is not None:
            on_result(res)
    return results
