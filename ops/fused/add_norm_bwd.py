"""Host side of the fused backward of ``add_layer_norm`` / ``add_rms_norm`` (the Triton source is
``add_norm_bwd_kernel`` in ``add_norm_kernels.py``): which route a backward takes, its config
(``add_norm.json`` rules with ``"pass": "backward"``), the launch and the d(w)/d(b) reduction.

One kernel launch per backward computes, per row tile, from the saved sum ``s`` (or x + residual
recomputed where the sum was not kept), ``dy``, the returned sum's gradient ``ds`` (where one
reached it), the weight and the forward's fp32 ``mean``/``rstd``::

    d(s) = rstd * (g - mean(g) - xhat * mean(g * xhat)) + ds,   g = dy * w   (RMSNorm: no mean(g))

and writes it once, as d(x) in x's dtype and, where the residual's dtype differs, as d(residual)
in its own (the same tensor serves both otherwise). A broadcast residual gets d(s) in fp32, summed
over its broadcast dims by ``sum_to_size``. d(w) = Σ dy * xhat and d(b) = Σ dy are summed per
program into an fp32 ``part`` buffer ``[programs, K, N]`` (K = 1 or 2), which ``part_sum_kernel``
sums over the programs in a fixed order and writes in the parameters' dtypes: one launch, where
aten's ``part.sum(0)`` and the casts to bf16/fp16 took two or three (an H100's profile of a
BERT-base training step at 1 x 128 tokens: 3.5 µs for each block's fp32 column sum alone).
The grid is persistent: ``WAVES`` programs per compute unit (SM), capped by the tiles and the
backend's grid, so ``part`` stays ``WAVES * SMs * K * N * 4`` bytes (1.6 MB for BERT on an H100).

Memory traffic per element of d(x), bf16, same-shape residual of the same dtype, one chunk: read
s, dy, ds, write d(x) = 8 bytes (6 without ds), plus 8 bytes of statistics per row and the
``part`` buffer. Torch's eager backward of ``x + r; F.layer_norm`` moves 16: aten's LayerNorm
backward reads s and dy and writes d(s) (6), its d(gamma)/d(beta) kernel reads s and dy again (4),
and autograd's accumulation of d(s) with ds reads both and writes the sum (6). The chunked
variant (rows longer than ``BLOCK_N``) reads s and dy twice.

Routes: the kernel where the forward's backend runs Triton, every operand and gradient dtype is
a kernel dtype (fp16, bf16, fp32), the statistics are there (they are unless a plugin computed
the forward) and the table's rule says ``"backward": "kernel"`` (the built-in default); else the
PyTorch backward (``add_norm_grad.norm_backward``): float64, the cpu backend, ``"backward": "torch"``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.launch import Launcher
from xkernels.ops.fused import add_norm_plan
from xkernels.ops.fused.add_norm_plan import KERNEL_DTYPES, row_stride
from xkernels.ops.layout import INT32_MAX, contiguous_strides, next_pow2, prod
from xkernels.registry import registry
from xkernels.tuning import _forced

#: The backward's config when no table rule matches: the route, the tile, programs per compute unit.
BWD_DEFAULT = {"backward": "kernel", "BLOCK_N": 4096, "BLOCK_M": 1, "num_warps": 4, "WAVES": 2}
_plans: OrderedDict[Any, BwdPlan] = OrderedDict()
_routes: OrderedDict[Any, str] = OrderedDict()  # a backward signature -> "kernel" / "torch" (see route())
PLAN_CACHE_SIZE = 256
#: part_sum_kernel's tile: at most SUM_COLS columns per program (fewer until the programs fill the
#: compute units), SUM_ROWS partial rows per step, SUM_TILE elements
SUM_COLS, SUM_ROWS, SUM_TILE = 64, 128, 2048
registry.listeners.append(_plans.clear)  # a plugin's tables may change the configs
registry.listeners.append(_routes.clear)


def _rows(t: torch.Tensor | None, shape: torch.Size) -> tuple[torch.Tensor | None, int]:
    """``t`` as rows of ``shape`` with one row stride: (the tensor, possibly copied, its stride)."""
    if t is None:
        return None, 0
    st = row_stride(t, shape)
    if st is None:
        return t.expand(shape).contiguous(), int(shape[-1])
    return t, st


def _meta(t: torch.Tensor | None) -> Any:
    return None if t is None else (t.dtype, t.stride())


class BwdPlan:
    """One backward signature's launch: config, grid, constexprs; see the module doc."""

    def __init__(self, backend: Backend, device: torch.device, kind: str, shape: torch.Size, s_dtype: torch.dtype,
                 strides: dict[str, int], flags: dict[str, bool], config: dict[str, Any], source: str) -> None:
        import triton.language as tl

        from xkernels.ops.fused import add_norm_kernels as K

        n, rows = int(shape[-1]), prod(shape[:-1])
        block_n = min(max(16, int(config["BLOCK_N"])), max(16, next_pow2(n)))
        block_m = max(1, min(int(config["BLOCK_M"]), next_pow2(rows)))
        tiles = max(1, (rows + block_m - 1) // block_m)
        programs = backend.programs(tiles, "vector", device)
        units = backend.compute_units(device)
        if units:
            programs = max(1, min(programs, int(config.get("WAVES") or 1) * units))
        self.n_part = flags["NEED_DW"] + flags["NEED_DB"]
        self.one_chunk = n <= block_n
        reach = max([abs(v) for v in strides.values()] + [n]) * max(rows - 1, 0) + n
        index64 = reach + 2**16 > INT32_MAX or programs * self.n_part * n + 2**16 > INT32_MAX
        self.programs, self.tiles, self.n = programs, tiles, n
        self.grid = (programs,)
        self.tail = (rows, n, *(strides[k] for k in ("s", "x", "residual", "dy", "ds", "dx", "dr")))
        self.db_at = n if flags["NEED_DW"] else 0
        s_ty = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[s_dtype]
        self.constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, RMS=kind == "rms", **flags,
                               ONE_CHUNK=self.one_chunk, INDEX_64=index64, S_TY=s_ty)
        self.options = {k: config[k] for k in backend.launch_options if config.get(k) is not None}
        self.config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "programs": programs, **self.options,
                       "INDEX_64": index64}
        self.source = source
        self.launcher = Launcher(backend.kernel(K.add_norm_bwd_kernel), self.grid, self.constexprs, self.options,
                                 backend.fast_launch)
        self._filler: torch.Tensor | None = None
        self._backend, self._device, self._index64, self._flags = backend, device, index64, flags
        self._summers: dict[Any, list[Any]] = {}  # (w dtype, b dtype) -> part_sum_kernel's launch (summer())

    def filler(self, device: torch.device) -> torch.Tensor:
        """The tensor passed for absent operands (never read or written: constexpr flags), one per
        plan, so a launch record's fixed arguments stay valid."""
        if self._filler is None:
            self._filler = torch.empty(4, dtype=torch.float32, device=device)
        return self._filler

    def part(self, empty: Any, device: torch.device) -> torch.Tensor | None:
        """The fp32 partial sums of d(w)/d(b), ``[programs, K, N]``: uninitialised where one chunk
        stores every element, zeros where chunks add into it atomically; ``None`` without d(w)/d(b)."""
        if not self.n_part:
            return None
        shape = (self.programs, self.n_part, self.n)
        return empty(shape, torch.float32, device) if self.one_chunk else torch.zeros(shape, dtype=torch.float32,
                                                                                     device=device)

    def summer(self, w_dtype: torch.dtype | None, b_dtype: torch.dtype | None) -> list[Any]:
        """``[launcher, hot launch or None, (column blocks, programs)]`` of ``part_sum_kernel`` for these parameter dtypes:
        up to ``SUM_COLS`` columns per program, halved down to 16 while the programs are fewer
        than the compute units, the partials' rows (at most ``WAVES * SMs``) in steps of up to
        ``SUM_ROWS`` (by rule: results/2026-11-28-h200-norm-parameter-sums measured the first
        form, 64 columns, slower than aten's sum at 8192 x 768 with its 12 programs)."""
        key = (w_dtype if self._flags["NEED_DW"] else None, b_dtype if self._flags["NEED_DB"] else None)
        entry = self._summers.get(key)
        if entry is None:
            import triton.language as tl

            from xkernels.ops.fused import add_norm_kernels as K

            ty = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
            block_n = min(SUM_COLS, max(16, next_pow2(self.n)))
            units = self._backend.compute_units(self._device) or 1
            while block_n > 16 and (self.n + block_n - 1) // block_n < units:
                block_n //= 2  # a program per compute unit where the columns allow (BERT's 768: 48)
            block_p = min(SUM_ROWS, max(2, next_pow2(self.programs)), max(2, SUM_TILE // block_n))
            constexprs = dict(NEED_DW=self._flags["NEED_DW"], NEED_DB=self._flags["NEED_DB"],
                              BLOCK_P=block_p, BLOCK_N=block_n,
                              INDEX_64=self._index64, W_TY=ty.get(key[0], tl.float32), B_TY=ty.get(key[1], tl.float32))
            options = {k: v for k, v in (("num_warps", 4),) if k in self._backend.launch_options}
            blocks = (self.n + block_n - 1) // block_n
            grid = (self._backend.programs(blocks, "vector", self._device),)  # persistent where capped
            launcher = Launcher(self._backend.kernel(K.part_sum_kernel), grid, constexprs, options,
                                self._backend.fast_launch)
            entry = self._summers[key] = [launcher, None, (blocks, grid[0])]
        return entry

    def param_grads(self, part: torch.Tensor, w_dtype: torch.dtype | None, b_dtype: torch.dtype | None,
                    empty: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """d(w), d(b) (``None`` where not required) from ``part``: one ``part_sum_kernel`` launch,
        by its launch record from the second call of these dtypes on."""
        entry = self.summer(w_dtype, b_dtype)
        gw = empty((self.n,), w_dtype, part.device) if self._flags["NEED_DW"] else None
        gb = empty((self.n,), b_dtype, part.device) if self._flags["NEED_DB"] else None
        args = (part, part if gw is None else gw, part if gb is None else gb, self.programs, self.n, self.db_at,
                self.n_part * self.n, *entry[2])
        hot = entry[1]
        if hot is None or not hot(*args[:3]):
            entry[0](*args)
            if hot is None:
                entry[1] = entry[0].hot(args, 3)
        return gw, gb


def _lookup(backend: Backend, device: torch.device, kind: str, s_dtype: torch.dtype, n: int,
            rows: int) -> tuple[dict[str, Any], str]:
    key = {"pass": "backward", "norm": kind, "dtype": str(s_dtype).removeprefix("torch."), "n": n, "rows": rows}
    choice = tuning.lookup("add_norm", backend, backend.arch(device), key, BWD_DEFAULT)
    return choice.config, choice.source


def route(backend: Backend | None, device: torch.device, kind: str, s_dtype: torch.dtype, shape: torch.Size,
          dtypes: tuple[torch.dtype | None, ...]) -> str:
    """``"kernel"`` or ``"torch"``: the route of a backward (see the module doc). ``dtypes``: every
    operand's and gradient's dtype (``None`` for an absent one)."""
    if backend is None or not backend.runs_triton or prod(shape) == 0:
        return "torch"
    if s_dtype not in KERNEL_DTYPES or any(d is not None and d not in KERNEL_DTYPES for d in dtypes):
        return "torch"
    # the table lookup stats every tuning directory: once per signature (as the plans), not per call
    key = (backend.name, device, kind, s_dtype, shape, tuning.forced_key())
    how = _routes.get(key)
    if how is not None:
        return how
    config, _ = _lookup(backend, device, kind, s_dtype, int(shape[-1]), prod(shape[:-1]))
    how = config.get("backward", "kernel")
    if how not in ("kernel", "torch"):
        raise ValueError(f"xkernels: add_norm tuning rule for the backward says \"backward\": {how!r}; "
                         f"expected \"kernel\" or \"torch\"")
    _routes[key] = how
    while len(_routes) > PLAN_CACHE_SIZE:
        _routes.popitem(last=False)
    return how


def backward(backend: Backend, kind: str, offset: float, dy: torch.Tensor, ds: torch.Tensor | None,
             s: torch.Tensor | None, x: torch.Tensor | None, residual: torch.Tensor | None,
             mean: torch.Tensor | None, rstd: torch.Tensor, weight: torch.Tensor | None, bias_dtype: torch.dtype | None,
             shape: torch.Size, s_dtype: torch.dtype, x_dtype: torch.dtype,
             res: tuple[torch.Size, torch.dtype] | None,
             needs: tuple[bool, bool, bool, bool], launched: list | None = None) -> tuple[torch.Tensor | None, ...]:
    """(d(x), d(residual), d(weight), d(bias)) by the kernel; ``needs``: which are required.
    ``s`` is the saved sum, or ``None``: recomputed from ``x`` and ``residual`` (which are then
    given). The caller has checked :func:`route`. ``launched``: where given, the plan and the
    launch's arguments are appended to it (:class:`HotBackward` makes its record from them)."""
    dev = dy.device
    n, rows = int(shape[-1]), prod(shape[:-1])
    need_x, need_r = needs[0], needs[1] and res is not None
    need_dw, need_db = needs[2] and weight is not None, needs[3] and bias_dtype is not None
    broadcast = res is not None and tuple(res[0]) != tuple(shape)
    shared = need_x and need_r and not broadcast and res is not None and res[1] == x_dtype
    empty = add_norm_plan._empty  # looked up per call: tests poison it
    dx = empty(shape, x_dtype, dev) if need_x else None
    dr = None
    if need_r and not shared:
        dr = empty(shape, torch.float32 if broadcast else res[1], dev)
    if not (need_x or need_r or need_dw or need_db):
        return None, None, None, None
    dy, sdy = _rows(dy, shape)
    ds, sds = _rows(ds, shape)
    s_rows, ss = _rows(s, shape)
    x_rows, sx = _rows(x if s is None else None, shape)
    r_rows, sr = _rows(residual if s is None else None, shape)
    flags = dict(HAS_S=s is not None, HAS_RES=s is None and residual is not None, HAS_W=weight is not None,
                 HAS_DS=ds is not None, STORE_X=dx is not None, STORE_R=dr is not None, NEED_DW=need_dw,
                 NEED_DB=need_db)
    strides = {"s": ss, "x": sx, "residual": sr, "dy": sdy, "ds": sds, "dx": n, "dr": n}
    key = (backend.name, dev, kind, shape, s_dtype, _meta(s_rows), _meta(x_rows), _meta(r_rows), _meta(dy),
           _meta(ds), _meta(weight), None if dx is None else dx.dtype, None if dr is None else dr.dtype,
           tuple(flags.values()), tuning.forced_key())
    plan = _plans.get(key)
    if plan is None:
        config, source = _lookup(backend, dev, kind, s_dtype, n, rows)
        plan = _plans[key] = BwdPlan(backend, dev, kind, shape, s_dtype, strides, flags, config, source)
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    part = plan.part(empty, dev)
    f = plan.filler(dev)  # absent operands are never read or written (constexpr flags)
    args = (f if s_rows is None else s_rows, f if x_rows is None else x_rows, f if r_rows is None else r_rows, dy,
            f if ds is None else ds, f if weight is None else weight, f if mean is None else mean, rstd,
            f if dx is None else dx, f if dr is None else dr, f if part is None else part,
            *plan.tail, float(offset), plan.db_at, plan.n_part * n, plan.tiles, plan.programs)
    plan.launcher(*args)
    if launched is not None:
        launched.append((plan, args))
    return finish(plan, part, dx, dr, weight, bias_dtype, res, need_dw, need_db, need_r, shared, broadcast)


def finish(plan: BwdPlan, part: torch.Tensor | None, dx: torch.Tensor | None, dr: torch.Tensor | None,
           weight: torch.Tensor | None, bias_dtype: torch.dtype | None, res: tuple[torch.Size, torch.dtype] | None,
           need_dw: bool, need_db: bool, need_r: bool, shared: bool,
           broadcast: bool) -> tuple[torch.Tensor | None, ...]:
    """The gradients from a launch's outputs: d(w) and d(b) summed over programs (``part_sum_kernel``),
    d(residual) shared with d(x) or summed to its shape."""
    gw = gb = None
    if part is not None:
        gw, gb = plan.param_grads(part, None if weight is None else weight.dtype, bias_dtype, add_norm_plan._empty)
    gr = None
    if need_r:
        gr = dx if shared else dr.sum_to_size(res[0]).to(res[1]) if broadcast else dr
    return dx, gr, gw, gb


#: tensor positions of ``add_norm_bwd_kernel``'s arguments (the launch's first 11)
_TENSORS = 11


class HotBackward:
    """The backwards of one forward signature (``add_norm_route``: a route's ``autograd_run``
    hands it to ``AddNormFunction``), launched without the generic path's per-call key and plan
    lookup: by what can still differ between them (``dy``'s and ``ds``'s dtype and strides,
    which gradients are required, the RMSNorm offset), the plan of the first such backward with
    a launch record of its tensors (``Launcher.hot``; absent operands are the plan's fixed
    filler). ``__call__`` returns ``None`` where the generic path must run: a forced config (a
    sweep), a backward whose route is PyTorch's, a residual broadcast to
    ``x``, gradients not in rows of one stride."""

    LIMIT = 16

    def __init__(self, backend: Backend, kind: str, shape: torch.Size, s_dtype: torch.dtype, x_dtype: torch.dtype,
                 res: tuple[torch.Size, torch.dtype] | None, bias_dtype: torch.dtype | None,
                 device: torch.device) -> None:
        self.backend, self.kind, self.shape, self.s_dtype, self.x_dtype = backend, kind, shape, s_dtype, x_dtype
        self.res, self.bias_dtype, self.device = res, bias_dtype, device
        self.fns: dict[Any, Any] = {}
        self.natives: dict[Any, Any] = {}  # key -> what a native grad_fn needs to launch it (``native_backward``)

    def __call__(self, offset: float, dy: torch.Tensor, ds: torch.Tensor | None, s: torch.Tensor,
                 mean: torch.Tensor | None, rstd: torch.Tensor, weight: torch.Tensor | None,
                 needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, ...] | None:
        if _forced.get() is not None or torch.compiler.is_compiling():
            return None
        key = self.key(offset, dy, ds, needs)
        fn = self.fns.get(key)
        if fn is not None:
            return fn(dy, ds, s, mean, rstd, weight) if fn is not False else None
        if len(self.fns) >= self.LIMIT:
            self.fns.clear()
        return self._first(key, offset, dy, ds, s, mean, rstd, weight, needs)

    @staticmethod
    def key(offset: float, dy: torch.Tensor, ds: torch.Tensor | None, needs: tuple[bool, ...]) -> Any:
        return dy.dtype, dy.stride(), None if ds is None else (ds.dtype, ds.stride()), tuple(needs), offset

    def native_backward(self, offset: float, dy: torch.Tensor, ds: torch.Tensor | None,
                        needs: tuple[bool, ...]) -> tuple[Any, ...] | None:
        """(launch, present, needs, description) of this key's repeat for a native grad_fn
        (``AddNormSpec.set_backward``, ``backends/native.cpp``), or ``None``: no repeat yet, or one
        whose launch is not a packed record (nor a CPU backend's Python launch), or gradients not in
        contiguous rows."""
        return self.natives.get(self.key(offset, dy, ds, needs))

    def _first(self, key: Any, offset: float, dy: torch.Tensor, ds: torch.Tensor | None, s: torch.Tensor,
               mean: torch.Tensor | None, rstd: torch.Tensor, weight: torch.Tensor | None,
               needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, ...] | None:
        """The first backward of ``key``: the generic kernel path, then the entry for its repeats
        (``False``: they take the generic path too)."""
        shape, res, kind = self.shape, self.res, self.kind
        dtypes = (self.x_dtype, None if res is None else res[1], None if weight is None else weight.dtype,
                  self.bias_dtype, dy.dtype, None if ds is None else ds.dtype)
        plain = ((res is None or tuple(res[0]) == tuple(shape))
                 and row_stride(dy, shape) is not None and (ds is None or row_stride(ds, shape) is not None)
                 and row_stride(s, shape) is not None
                 and route(self.backend, dy.device, kind, self.s_dtype, shape, dtypes) == "kernel")
        if not plain:
            self.fns[key] = False
            return None
        launched: list = []
        out = backward(self.backend, kind, offset, dy, ds, s, None, None, mean, rstd, weight, self.bias_dtype, shape,
                       self.s_dtype, self.x_dtype, res, needs, launched)  # type: ignore[arg-type]
        plan, args = launched[0]
        self.fns[key] = self._entry(plan, args, needs, weight, key)
        return out

    def _entry(self, plan: BwdPlan, args: tuple[Any, ...], needs: tuple[bool, ...],
               weight: torch.Tensor | None, key: Any) -> Any:
        """The repeat's launch: allocate d(x), d(residual) and the partial sums, launch by the
        record (or the ordinary way where it declines), finish as the generic path does."""
        filler = plan.filler(self.device)
        pos = tuple(i for i in range(_TENSORS) if args[i] is not filler)
        launch = plan.launcher.hot(args, pos)
        shape, res, x_dtype, bias_dtype = self.shape, self.res, self.x_dtype, self.bias_dtype
        need_x, need_r = needs[0], needs[1] and res is not None
        need_dw, need_db = needs[2] and weight is not None, needs[3] and bias_dtype is not None
        shared = need_x and need_r and res[1] == x_dtype  # type: ignore[index]
        alloc = add_norm_plan.allocator(self.backend, self.device)
        size, stride = tuple(shape), contiguous_strides(tuple(shape))
        dr_dtype = None if not need_r or shared else res[1]  # type: ignore[index]
        how = native_launch(launch, self.backend)
        n = plan.n
        _, _, s_st, _, _, dy_st, ds_st, *_ = plan.tail
        if how is not None and s_st == n and dy_st == n and (args[4] is filler or ds_st == n) and key[0] == self.s_dtype \
                and (args[4] is filler or key[2][0] == self.s_dtype):
            self.natives[key] = (how, tuple(i in pos for i in range(_TENSORS)), tuple(bool(v) for v in needs), dict(
                need_x=bool(need_x), need_r=bool(need_r), need_dw=bool(need_dw), need_db=bool(need_db),
                shared=bool(shared), one_chunk=plan.one_chunk, programs=plan.programs, n_part=plan.n_part, n=n,
                x_dtype=x_dtype, dr_dtype=dr_dtype, w_dtype=None if weight is None else weight.dtype,
                b_dtype=bias_dtype, sum=self._native_sum(plan, weight, bias_dtype)))
        empty = add_norm_plan._empty
        fixed = args[_TENSORS:]
        f = filler

        def run(dy: torch.Tensor, ds: torch.Tensor | None, s: torch.Tensor, mean: torch.Tensor | None,
                rstd: torch.Tensor, w: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
            dx = alloc(size, stride, x_dtype) if need_x else None
            dr = alloc(size, stride, dr_dtype) if dr_dtype is not None else None
            part = plan.part(empty, dy.device)
            full = (s, f, f, dy, f if ds is None else ds, f if w is None else w, f if mean is None else mean, rstd,
                    f if dx is None else dx, f if dr is None else dr, f if part is None else part)
            if not launch(*[full[i] for i in pos]):
                plan.launcher(*full, *fixed)
            return finish(plan, part, dx, dr, w, bias_dtype, res, need_dw, need_db, need_r, shared, False)

        return run

    def _native_sum(self, plan: BwdPlan, weight: torch.Tensor | None, bias_dtype: torch.dtype | None) -> Any:
        """What a native grad_fn launches ``part_sum_kernel`` with (the record the first backward's
        ``param_grads`` made), or ``None``: no partials, or no record (it sums with aten's ``sum``)."""
        if not plan.n_part:
            return None
        hot = plan.summer(None if weight is None else weight.dtype, bias_dtype)[1]
        return None if hot is None else native_launch(hot, self.backend)


def native_launch(launch: Any, backend: Backend) -> Any:
    """What a native grad_fn launches with (``backends/native.launch_spec``)."""
    from xkernels.backends import native

    return native.launch_spec(launch, backend.name)
