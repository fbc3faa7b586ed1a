"""Host side of the element-wise binary ops (``add``, ``broadcast``): layout analysis, kernel
variant and config choice, launch. The Triton source is ``elementwise/kernels.py``.

Layout analysis collapses the broadcast result's dims jointly over out, x and y (adjacent dims
merge when every operand's strides allow it; size-1 dims drop). Then:

* ``flat``: one dim, every tensor operand contiguous over it (same-shape contiguous add);
* ``tiled``: up to four dims with any strides; an operand whose row strides are all zero
  (a bias of length ``x.shape[-1]``) is loaded once per tile as a row;
* more than four non-collapsible dims: the operands are made contiguous first (rare).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.backends import cuda_launch
from xkernels.launch import ByValue, Launcher
from xkernels.ops import checks
from xkernels.ops.layout import INT32_MAX, collapse, contiguous_strides, max_offset, next_pow2, prod
from xkernels.ops.native_front_door import RESULT, NativeSpec, kernel_spec, launch_how
from xkernels.ops.op import Op, Plan
from xkernels.ops.route import KernelRoute

MAX_DIMS = 4

FLAT_DEFAULT = {"BLOCK": 2048, "SUB": None, "num_warps": 4}
TILED_DEFAULT = {"BLOCK_M": 8, "BLOCK_N": 256, "SUB_M": None, "num_warps": 4}


@dataclass
class BinaryCall:
    x: torch.Tensor | Any  # tensor or Python number
    y: torch.Tensor | Any
    alpha: Any
    out: torch.Tensor | None
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    kernel_ok: bool
    fallback_reason: str = ""
    no_tensor: bool = False  # both operands are Python numbers (add(2, 3))


def _as_scalar(v: Any) -> Any:
    """Python numbers, and 0-d tensors on the CPU joining a device tensor, pass by value."""
    if isinstance(v, torch.Tensor):
        return v.item()
    return v


def _meta(v: Any, device: torch.device) -> Any:
    if isinstance(v, torch.Tensor) and not (v.dim() == 0 and v.device != device):
        return (tuple(v.shape), v.stride(), v.dtype)
    return ("scalar", type(_as_scalar(v)).__name__)


class BinaryPlan(Plan):
    def __init__(self, backend: Backend, call: BinaryCall, op_name: str) -> None:
        from xkernels.ops.elementwise import kernels as K

        has_alpha = call.alpha != 1

        shape = tuple(call.shape)
        tensors = {}
        modes = {}
        for name in ("x", "y"):
            v = getattr(call, name)
            if isinstance(v, torch.Tensor) and not (v.dim() == 0 and v.device != call.device):
                tensors[name] = v.expand(shape).stride() if shape else ()
            else:
                modes[name] = 2
        out_strides = contiguous_strides(shape) if call.out is None else call.out.stride()
        names = ["out", *tensors]
        sizes, strides = collapse(shape, [tuple(out_strides), *[tuple(tensors[n]) for n in tensors]])
        by_name = dict(zip(names, strides))
        self.materialize = len(sizes) > MAX_DIMS
        if self.materialize:  # more than 4 non-collapsible dims: copy operands to contiguous
            sizes, by_name = [prod(shape)], {n: [1] for n in names}
        numel = prod(sizes)
        flat = len(sizes) == 1 and all(st == [1] for st in by_name.values())
        index64 = any(max_offset(sizes, st) + 2**16 > INT32_MAX for st in by_name.values())
        dtype_name = str(call.dtype).removeprefix("torch.")
        self.compute = _tl_dtype(call.dtype)
        self.backend = backend
        self.names = names
        arch = backend.arch(call.device)
        if flat:
            key = {"variant": "flat", "dtype": dtype_name, "numel": numel, "n": numel, "rows": 1}
            choice = tuning.lookup(op_name, backend, arch, key, FLAT_DEFAULT)
            cfg = dict(choice.config)
            block = min(int(cfg["BLOCK"]), max(16, next_pow2(numel)))
            sub = math.gcd(min(int(cfg.get("SUB") or block), block), block)  # SUB must divide BLOCK
            n_blocks = (numel + block - 1) // block
            programs = backend.programs(n_blocks, "vector", call.device)
            self.jit_fn = K.binary_flat_kernel
            self.grid = (programs,)
            self.tail = (numel, None, n_blocks, programs)  # alpha filled per call
            self.constexprs = dict(BLOCK=block, SUB=sub, X_MODE=modes.get("x", 0), Y_MODE=modes.get("y", 0),
                                   COMPUTE=self.compute, HAS_ALPHA=has_alpha, EVEN=numel % block == 0,
                                   PERSISTENT=programs < n_blocks, INDEX_64=index64)
            self.variant, tiles = "flat", n_blocks
            shown = {"BLOCK": block, "SUB": sub}
        else:
            sizes = [1] * (MAX_DIMS - len(sizes)) + sizes
            for n in names:
                by_name[n] = [0] * (MAX_DIMS - len(by_name[n])) + by_name[n]
            rows, n_cols = prod(sizes[:3]), sizes[3]
            for n in tensors:
                if all(s == 0 for s in by_name[n][:3]):
                    modes[n] = 1
            key = {"variant": "tiled", "dtype": dtype_name, "numel": numel, "n": n_cols, "rows": rows,
                   "row_operand": any(m == 1 for m in modes.values())}
            choice = tuning.lookup(op_name, backend, arch, key, TILED_DEFAULT)
            cfg = dict(choice.config)
            bn_cfg, bm_cfg = int(cfg["BLOCK_N"]), int(cfg["BLOCK_M"])
            block_n = min(bn_cfg, max(16, next_pow2(n_cols)))
            scale = bn_cfg // block_n
            block_m = max(1, min(bm_cfg * scale, next_pow2(rows)))
            sub_m = math.gcd(max(1, min(int(cfg.get("SUB_M") or bm_cfg) * scale, block_m)), block_m)
            tiles_n = (n_cols + block_n - 1) // block_n
            tiles = ((rows + block_m - 1) // block_m) * tiles_n
            programs = backend.programs(tiles, "vector", call.device)
            self.jit_fn = K.binary_tiled_kernel
            self.grid = (programs,)
            zero = [0, 0, 0, 0]
            self.tail = (rows, n_cols, tiles_n, tiles, programs, sizes[1], sizes[2],
                         *by_name.get("x", zero), *by_name.get("y", zero), *by_name["out"])
            self.constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, SUB_M=sub_m,
                                   X_MODE=modes.get("x", 0), Y_MODE=modes.get("y", 0), COMPUTE=self.compute,
                                   HAS_ALPHA=has_alpha, EVEN=rows % block_m == 0 and n_cols % block_n == 0,
                                   PERSISTENT=programs < tiles, INDEX_64=index64)
            self.variant = "tiled" + (" (row operand loaded once per tile)" if key["row_operand"] else "")
            shown = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SUB_M": sub_m}
        self.options = {k: cfg[k] for k in backend.launch_options if cfg.get(k) is not None}
        self.config = {**shown, **self.options, "INDEX_64": index64}
        varying = (0, 1, 2, 4) if self.variant == "flat" else (0, 1, 2, 3)  # x, y, out, alpha
        self.launcher = Launcher(backend.kernel(self.jit_fn), self.grid, self.constexprs, self.options,
                                 backend.fast_launch, varying)
        self.source = choice.source
        self.measured = choice.measured
        self.programs, self.tiles = programs, tiles

    def launch(self, x: Any, y: Any, out: torch.Tensor, alpha: Any) -> None:
        if self.materialize and not out.is_contiguous():
            tmp = torch.empty(out.shape, dtype=out.dtype, device=out.device)
            self.launch(x, y, tmp, alpha)
            out.copy_(tmp)
            return
        if self.materialize:
            shape = out.shape
            x = x.expand(shape).contiguous() if "x" in self.names else x
            y = y.expand(shape).contiguous() if "y" in self.names else y
        self.launcher(*self.args(x, y, out, alpha))

    def args(self, x: Any, y: Any, out: torch.Tensor, alpha: Any) -> tuple[Any, ...]:
        """The kernel's runtime arguments, in order (constexprs are ``self.constexprs``)."""
        xa = x if self.constexprs["X_MODE"] != 2 else _as_scalar(x)
        ya = y if self.constexprs["Y_MODE"] != 2 else _as_scalar(y)
        a = alpha if self.constexprs["HAS_ALPHA"] else 1
        if self.variant == "flat":
            n, _, n_blocks, programs = self.tail
            return (xa, ya, out, n, a, n_blocks, programs)
        return (xa, ya, out, a, *self.tail)


def _per_value(plan: BinaryPlan, template: tuple[Any, Any, torch.Tensor], ptrs: tuple[int, ...]) -> ByValue:
    """Launch functions per (scalar operand, alpha) value (``launch.ByValue``); ``template`` holds
    placeholders for the tensors at ``ptrs``."""
    x_scalar, y_scalar = plan.constexprs["X_MODE"] == 2, plan.constexprs["Y_MODE"] == 2

    def make(scalar: Any, alpha: Any) -> Any:
        x, y, out = template
        return plan.launcher.hot(plan.args(scalar if x_scalar else x, scalar if y_scalar else y, out, alpha), ptrs)

    return ByValue(make)


def _hot_with_out(plan: BinaryPlan, call: BinaryCall) -> Any:
    """The hot entry of ``op(x, y, out=out)``. Shapes, strides and dtypes are fixed by the entry's
    key; what can differ per call is aliasing, so ``check_out``'s rule (``out`` is an input's
    own view or disjoint from it) is re-checked on the data pointers: a partial overlap goes to
    the full path, which raises."""
    x, y, out = call.x, call.y, call.out
    assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and out is not None
    per_value = _per_value(plan, (x, y, out), (0, 1, 2)) if plan.constexprs["HAS_ALPHA"] else None
    launch = plan.launcher.hot(plan.args(x, y, out, 1), 3) if per_value is None else None

    def extent(t: torch.Tensor) -> int:  # bytes from the first to past the last element
        return (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()

    eo, ex, ey = extent(out), extent(x), extent(y)
    x_same = x.shape == out.shape and x.stride() == out.stride() and x.dtype == out.dtype
    y_same = y.shape == out.shape and y.stride() == out.stride() and y.dtype == out.dtype
    fns = per_value.fns if per_value is not None else {}
    by_pointer = launch is not None and cuda_launch.is_record(launch)  # a record takes the pointers read here

    def hot(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, alpha: Any = 1) -> torch.Tensor | None:
        po, px, py = out.data_ptr(), x.data_ptr(), y.data_ptr()
        if (po < px + ex and px < po + eo and not (x_same and po == px)) or (
                po < py + ey and py < po + eo and not (y_same and po == py)):
            return None
        if by_pointer:
            return out if launch(px, py, po) else None
        # ByValue's own lookup spelled out (a zero needs its signed key: ByValue decides)
        fn = launch or (fns.get((None, alpha)) if alpha else None) or per_value(None, alpha)
        return out if fn(x, y, out) else None

    def native(canon: tuple[Any, ...]) -> NativeSpec | None:  # (x, y, out[, alpha]): the out= tensor is the result
        alpha = canon[3] if len(canon) > 3 else 1
        how = launch_how(launch if per_value is None else per_value(None, alpha), out.device)
        return None if how is None else NativeSpec("launch", how, (0, 1, 2), out=2, overlap=((0, ex, x_same),
                                                   (1, ey, y_same)), out_extent=eo)

    hot.launch = launch  # type: ignore[attr-defined]  # None where scalars are packed per value
    hot.native = native  # type: ignore[attr-defined]
    return hot


def _hot_two_tensors(plan: BinaryPlan, call: BinaryCall) -> Any:
    """The entry of ``op(x, y)`` with two device tensors and no ``alpha``: allocate, launch."""
    x, y = call.x, call.y
    if not all(isinstance(t, torch.Tensor) and t.device == call.device for t in (x, y)):
        return None
    launch = plan.launcher.hot(plan.args(x, y, torch.empty(0, dtype=call.dtype, device=call.device), 1), 3)
    size, dtype = tuple(call.shape), call.dtype
    stride, alloc = contiguous_strides(size), plan.backend.allocator(call.device)

    def hot(x: torch.Tensor, y: torch.Tensor, out: None = None, alpha: Any = 1) -> torch.Tensor | None:
        out = alloc(size, stride, dtype)
        return out if launch(x, y, out) else None

    spec = kernel_spec(launch, call.device, (0, 1, RESULT), size, stride, dtype)
    hot.launch = launch  # type: ignore[attr-defined]  # the (x, y, out) launch: enable()'s native override takes it
    hot.native = lambda canon: spec  # type: ignore[attr-defined]
    return hot


def _tl_dtype(dtype: torch.dtype) -> Any:
    import triton.language as tl

    if dtype.is_floating_point:
        return tl.float32
    return {torch.int32: tl.int32, torch.int64: tl.int64}[dtype]


class BinaryOp(Op):
    """Shared routing of ``add`` and ``broadcast``; subclasses define ``check``."""

    def _call(self, x: Any, y: Any, alpha: Any, out: torch.Tensor | None, shape: torch.Size,
              device: torch.device) -> BinaryCall:
        dtype = torch.result_type(x, y)
        tensors = {n: v for n, v in (("x", x), ("y", y)) if isinstance(v, torch.Tensor)}
        checks.check_out(self.name, out, shape, dtype, device, tensors)
        if not (type(alpha) is int and alpha == 1):
            checks.check_alpha(self.name, alpha, dtype)
        kinds = [t.dtype for t in tensors.values()]
        kernel_ok = dtype in checks.ELEMENTWISE_KERNEL_DTYPES and all(
            d in checks.ELEMENTWISE_KERNEL_DTYPES for d in kinds)
        reason = "" if kernel_ok else (f"dtype {dtype} (inputs {', '.join(map(str, kinds))}) has no Triton kernel; "
                                       f"PyTorch computes it")
        return BinaryCall(x, y, alpha, out, shape, dtype, device, kernel_ok, reason)

    def torch_impl(self, call: BinaryCall) -> torch.Tensor:
        x, y = call.x, call.y
        if not isinstance(x, torch.Tensor):  # torch.add wants a tensor first
            x = torch.tensor(x, dtype=call.dtype, device=call.device)
        result = torch.add(x, y, alpha=call.alpha) if call.alpha != 1 else torch.add(x, y)
        if call.out is None:
            return result
        call.out.copy_(result)
        return call.out

    def plan_key(self, call: BinaryCall, backend: Backend) -> Any:
        out_meta = None if call.out is None else call.out.stride()
        return (backend.name, call.device, _meta(call.x, call.device), _meta(call.y, call.device),
                call.dtype, out_meta, tuple(call.shape), call.alpha != 1)

    def make_plan(self, call: BinaryCall, backend: Backend) -> Plan:
        return BinaryPlan(backend, call, self.name)

    #: the built-in config of each kernel variant (no table rule matched)
    default_configs = {"flat": FLAT_DEFAULT, "tiled": TILED_DEFAULT}

    def compile_cases(self, target: Any) -> Any:
        from xkernels.ops.elementwise.compile import binary_cases

        return binary_cases(self, target)

    def compile_layouts(self, cfg: dict[str, Any], variant: str, dtype: torch.dtype) -> Any:
        """(label, args, kwargs) of the calls a ``variant`` tuning entry serves, for the compile check."""
        from xkernels.ops.elementwise.compile import base_layouts

        return base_layouts(cfg, variant, dtype)

    def make_hot(self, plan: Plan, call: BinaryCall, canon: tuple[Any, ...]) -> KernelRoute | None:
        """A route whose ``run(x, y, out, alpha)`` (``canon``: the call's arguments in ``params``
        order) allocates the result (or takes ``out=``) and launches with the call's tensors and
        by-value scalars (a Python number or CPU 0-d operand, ``alpha``). ``None`` (repeats keep
        the full path): both operands Python numbers, an operand copied or materialised, an
        empty result, an integer result with a float ``alpha`` (checked per value), ``out=``
        with a scalar operand."""
        entry = self._entry(plan, call, canon)
        return None if entry is None else KernelRoute(entry, f"{plan.variant} {plan.config}")

    def _entry(self, plan: Plan, call: BinaryCall, canon: tuple[Any, ...]) -> Any:
        assert isinstance(plan, BinaryPlan)
        x, y, alpha = call.x, call.y, call.alpha
        if (canon[0] is not x or canon[1] is not y or plan.materialize or prod(call.shape) == 0
                or not call.dtype.is_floating_point and isinstance(alpha, float) and alpha != 1):
            return None  # (an integer result checks a float alpha's value: keep the full path)
        scalar_x, scalar_y = plan.constexprs["X_MODE"] == 2, plan.constexprs["Y_MODE"] == 2
        if scalar_x and scalar_y:
            return None
        shape, dtype, device = call.shape, call.dtype, call.device
        if call.out is not None:
            return None if scalar_x or scalar_y else _hot_with_out(plan, call)
        if not scalar_x and not scalar_y and not plan.constexprs["HAS_ALPHA"]:
            return _hot_two_tensors(plan, call)
        tensor = y if scalar_x else x
        empty = torch.empty(0, dtype=dtype, device=device)
        ptrs = (1, 2) if scalar_x else (0, 2) if scalar_y else (0, 1, 2)
        launches = _per_value(plan, (tensor if not scalar_x else None, tensor if not scalar_y else None, empty), ptrs)
        size, stride, alloc = tuple(shape), contiguous_strides(tuple(shape)), plan.backend.allocator(device)
        fns = launches.fns  # ByValue's own lookup spelled out below (a zero needs its signed key: ByValue decides)
        if scalar_x or scalar_y:
            def hot_scalar(x: Any, y: Any, out: None = None, alpha: Any = 1) -> torch.Tensor | None:
                s, t = (x, y) if scalar_x else (y, x)
                if isinstance(s, torch.Tensor):  # a 0-d CPU tensor joining a device tensor
                    s = s.item()
                o = alloc(size, stride, dtype)
                fn = (fns.get((s, alpha)) if s and alpha else None) or launches(s, alpha)
                return o if fn(t, o) else None

            def native_scalar(canon: tuple[Any, ...]) -> NativeSpec | None:
                s = canon[0] if scalar_x else canon[1]
                if isinstance(s, torch.Tensor):  # its value is no part of the native key: Python runs it
                    return None
                alpha = canon[3] if len(canon) > 3 else 1
                return kernel_spec(launches(s, alpha), device, (1 if scalar_x else 0, RESULT), size, stride, dtype)

            hot_scalar.native = native_scalar  # type: ignore[attr-defined]
            return hot_scalar

        def hot_alpha(x: torch.Tensor, y: torch.Tensor, out: None = None, alpha: Any = 1) -> torch.Tensor | None:
            o = alloc(size, stride, dtype)
            fn = (fns.get((None, alpha)) if alpha else None) or launches(None, alpha)
            return o if fn(x, y, o) else None

        hot_alpha.native = lambda canon: kernel_spec(  # type: ignore[attr-defined]
            launches(None, canon[3] if len(canon) > 3 else 1), device, (0, 1, RESULT), size, stride, dtype)
        return hot_alpha

    def run_plan(self, plan: Plan, call: BinaryCall) -> torch.Tensor:
        out = call.out if call.out is not None else torch.empty(call.shape, dtype=call.dtype, device=call.device)
        if out.numel() == 0:
            return out
        assert isinstance(plan, BinaryPlan)
        plan.launch(call.x, call.y, out, call.alpha)
        return out
