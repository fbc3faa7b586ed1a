"""``rotary_embedding``: rotary position embeddings of q and k in one kernel launch.

    q_embed, k_embed = rotary_embedding(q, k, cos, sin, unsqueeze_dim=1, interleaved=False)

What transformers' ``apply_rotary_pos_emb`` computes (the ``rotate_half`` form of Llama, Mistral,
Qwen2/3, Gemma, ... and GPT-NeoX's / Phi-3's partial rotary), for ``x`` in ``(q, k)``:

    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim);  R = cos.shape[-1]
    x_embed = cat(x[..., :R] * c + rotate_half(x[..., :R]) * s, x[..., R:])

``interleaved=True``: adjacent columns are the pairs, ``rotate_pairs`` in place of ``rotate_half``
(``rotate_pairs(x)[..., 2i] = -x[..., 2i + 1]``, ``[..., 2i + 1] = x[..., 2i]``): Cohere's, GLM's,
Ernie 4.5's and GPT-J's rotation, with ``cos`` / ``sin`` given per column (each pair's value
twice, as those models' ``repeat_interleave`` makes them).

``R`` (even) may be less than the head dim (partial rotary: the rest passes unchanged). ``c`` and
``s`` must broadcast to ``x[..., :R]`` without growing it. Results are laid out as the formula
lays them out: as q / k where the rotation covers the head dim, contiguous for partial rotary.

Routes: the Triton kernel (``rotary_kernels.py``: both tensors in one launch, cos / sin read once
per row, fp32 inside, one rounding) where q, k, cos and sin share one dtype among fp16 / bf16 /
fp32, q and k share their head dim and have at most three leading dims; PyTorch's formula
otherwise (mixed dtypes: torch's promotion), on the cpu backend, and while ``torch.compile``
traces (Inductor fuses the formula into its own kernels; no custom op). A call requiring grad
records ``RotaryFunction``: the backward is the kernel's transposed rotation (one launch for dq
and dk). Where ``cos`` or ``sin`` requires grad, PyTorch's formula runs, so that autograd
records their gradients too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from xkernels import tuning
from xkernels.backend import Backend
from xkernels.dispatch import _override
from xkernels.launch import Launcher
from xkernels.ops import checks
from xkernels.ops.autograd import owned
from xkernels.ops.layout import INT32_MAX, next_pow2, prod
from xkernels.ops.op import KernelRoute, Op, Param, Plan, Route
from xkernels.tuning import _forced

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: rows per program and warps when no table rule matches; ``PAIRS``: how the kernel pairs adjacent
#: columns for ``interleaved=True`` ("split": in registers; "gather": a load at the partner column)
DEFAULT = {"ELEMENTS": 4096, "num_warps": 4, "PAIRS": "split"}
MAX_LEADING = 3  # leading dims the kernel indexes


@dataclass
class RotaryCall:
    """A validated call."""

    q: torch.Tensor
    k: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    unsqueeze_dim: int
    interleaved: bool
    rotary_dim: int
    device: torch.device
    kernel_ok: bool
    fallback_reason: str = ""
    backward: bool = False  # the transposed rotation (gradients of q and k)


def _check_tensor(name: str, v: Any) -> torch.Tensor:
    t = checks.require_tensor("rotary_embedding", name, v)
    if not t.dtype.is_floating_point:
        raise TypeError(f"xkernels.ops.rotary_embedding: '{name}' has dtype {t.dtype}; rotary_embedding takes "
                        f"floating-point tensors")
    return t


def check(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any = 1, interleaved: Any = False) -> RotaryCall:
    """Validate a call (``ValueError`` / ``TypeError`` naming the argument, before any kernel runs)."""
    op = "xkernels.ops.rotary_embedding"
    named = {n: _check_tensor(n, v) for n, v in (("q", q), ("k", k), ("cos", cos), ("sin", sin))}
    if isinstance(unsqueeze_dim, bool) or not isinstance(unsqueeze_dim, int):
        raise TypeError(f"{op}: 'unsqueeze_dim' must be an int, got {checks.describe(unsqueeze_dim)}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"{op}: 'interleaved' must be a bool, got {checks.describe(interleaved)}")
    devices = {n: t.device for n, t in named.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"'{n}' on {d}" for n, d in devices.items())
        raise ValueError(f"{op}: tensors must be on one device, got {listing}")
    if cos.shape != sin.shape:
        raise ValueError(f"{op}: 'cos' has shape {tuple(cos.shape)} and 'sin' {tuple(sin.shape)}; they must match")
    if cos.dim() == 0:
        raise ValueError(f"{op}: 'cos' is 0-d; it needs a last dim (the rotary dim)")
    if not -cos.dim() - 1 <= unsqueeze_dim <= cos.dim():
        raise ValueError(f"{op}: 'unsqueeze_dim' {unsqueeze_dim} is out of range for 'cos' of shape "
                         f"{tuple(cos.shape)} (from {-cos.dim() - 1} to {cos.dim()})")
    r = int(cos.shape[-1])
    at = unsqueeze_dim + cos.dim() + 1 if unsqueeze_dim < 0 else unsqueeze_dim
    cu = (*cos.shape[:at], 1, *cos.shape[at:])
    for name in ("q", "k"):
        x = named[name]
        if x.dim() == 0 or r % 2 or not 0 < r <= x.shape[-1]:
            raise ValueError(f"{op}: the rotary dim, cos.shape[-1] = {r}, must be even, above 0 and at most "
                             f"{name}'s last dim ({name} has shape {tuple(x.shape)})")
        target = (*x.shape[:-1], r)
        if len(cu) > len(target) or any(c not in (1, t) for c, t in zip(reversed(cu), reversed(target))):
            raise ValueError(f"{op}: 'cos' / 'sin' of shape {tuple(cos.shape)}, unsqueezed at dim {unsqueeze_dim} "
                             f"to {cu}, must broadcast to {name}[..., :{r}] of shape {target} without "
                             f"growing it ({name} has shape {tuple(x.shape)})")
    dtypes = {n: t.dtype for n, t in named.items()}
    reason = ""
    if len(set(dtypes.values())) > 1 or q.dtype not in KERNEL_DTYPES:
        reason = (f"dtypes {', '.join(f'{n} {d}' for n, d in dtypes.items())}: the kernel takes one dtype among "
                  f"fp16, bf16, fp32; PyTorch computes it with its promotion")
    elif q.shape[-1] != k.shape[-1]:
        reason = f"q's head dim {q.shape[-1]} differs from k's {k.shape[-1]}; PyTorch computes it"
    elif max(q.dim(), k.dim()) - 1 > MAX_LEADING:
        reason = (f"q / k have more than {MAX_LEADING} leading dims (shapes {tuple(q.shape)}, {tuple(k.shape)}); "
                  f"PyTorch computes it")
    return RotaryCall(q, k, cos, sin, unsqueeze_dim, interleaved, r, q.device, not reason, reason)


# -- PyTorch's formula -----------------------------------------------------------------------------
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """The interleaved ``rotate_half``: ``(-x[2i + 1], x[2i])`` for each pair of adjacent columns."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def torch_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 unsqueeze_dim: int = 1, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' formula, partial rotary included: the reference, the fallback route and the
    traced form under ``torch.compile``."""
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    r = cos.shape[-1]
    turn = rotate_pairs if interleaved else rotate_half

    def rotate(x: torch.Tensor) -> torch.Tensor:
        if r == x.shape[-1]:
            return x * c + turn(x) * s
        head = x[..., :r]
        return torch.cat([head * c + turn(head) * s, x[..., r:]], dim=-1)

    return rotate(q), rotate(k)


# -- the kernel's plan -------------------------------------------------------------------------------
def _leading(t: torch.Tensor, shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """(sizes, strides) of ``t`` expanded to ``shape``'s leading dims, padded in front to three."""
    e = t.expand(shape) if tuple(t.shape) != shape else t
    sizes, strides = list(shape[:-1]), list(e.stride()[:-1])
    pad = MAX_LEADING - len(sizes)
    return [1] * pad + sizes, [0] * pad + strides


def _result(x: torch.Tensor, full: bool) -> torch.Tensor:
    """The result's allocation, laid out as PyTorch's formula lays it out: as x (``empty_like``)
    where the rotation covers the head dim, contiguous where the formula ends in ``torch.cat``."""
    return torch.empty_like(x) if full else torch.empty(x.shape, dtype=x.dtype, device=x.device)


def plan_key(call: RotaryCall, backend: Backend) -> Any:
    return (backend.name, call.device, call.backward, call.unsqueeze_dim, call.interleaved, call.q.dtype,
            *((tuple(t.shape), t.stride()) for t in (call.q, call.k, call.cos, call.sin)))


class RotaryPlan(Plan):
    def __init__(self, backend: Backend, call: RotaryCall) -> None:
        from xkernels.ops.fused import rotary_kernels as K

        q, k, d, r = call.q, call.k, int(call.q.shape[-1]), call.rotary_dim
        self.backward = call.backward
        # copied first: an operand whose last dim is strided, cos / sin with different strides
        self.copies = [n for n, t in (("q", q), ("k", k)) if t.shape[-1] > 1 and t.stride(-1) != 1]
        if call.cos.stride() != call.sin.stride() or (r > 1 and call.cos.stride(-1) != 1):
            self.copies.append("cos and sin")
        key = {"dtype": str(q.dtype).removeprefix("torch."), "d": d,
               "rows": prod(q.shape[:-1]) + prod(k.shape[:-1]), "pass": "backward" if call.backward else "forward"}
        choice = tuning.lookup("rotary", backend, backend.arch(call.device), key, DEFAULT)
        cfg = dict(choice.config)
        block_d = max(16, next_pow2(d))
        block_r = max(1, min(int(cfg["ELEMENTS"]) // block_d, next_pow2(max(prod(q.shape[:-1]), 1))))
        q_rows, k_rows = prod(q.shape[:-1]), prod(k.shape[:-1])
        q_tiles, k_tiles = -(-q_rows // block_r), -(-k_rows // block_r)
        tiles = q_tiles + k_tiles
        programs = backend.programs(max(tiles, 1), "vector", call.device)
        reach = max(t.numel() for t in (q, k, call.cos)) * 2
        index64 = any(abs(s) * max(n - 1, 0) + reach + 2**16 > INT32_MAX
                      for t in (q, k) for s, n in zip(t.stride(), t.shape))
        self.q_tiles, self.n_tiles, self.grid = q_tiles, tiles, (programs,)
        split = call.interleaved and cfg.get("PAIRS", "split") == "split"
        if cfg.get("PAIRS", "split") not in ("split", "gather"):
            raise ValueError(f"rotary table ({choice.source}): PAIRS must be 'split' or 'gather', got {cfg['PAIRS']!r}")
        self.constexprs = dict(BLOCK_R=block_r, BLOCK_D=block_d, BACKWARD=call.backward,
                               INTERLEAVED=call.interleaved, SPLIT_PAIRS=split, PERSISTENT=programs < tiles,
                               INDEX_64=index64)
        self.options = {n: cfg[n] for n in backend.launch_options if cfg.get(n) is not None}
        self.config = {"BLOCK_R": block_r, "BLOCK_D": block_d, **self.options, "INDEX_64": index64}
        if call.interleaved:
            self.config["PAIRS"] = "split" if split else "gather"
        self.jit_fn = K.rotary_kernel
        # the six tensors vary between calls of the plan; its integers are fixed by its signature
        self.launcher = Launcher(backend.kernel(K.rotary_kernel), self.grid, self.constexprs, self.options,
                                 backend.fast_launch, varying=tuple(range(6)))
        what = "gradients of q and k (the transposed rotation)" if call.backward else "q and k"
        self.variant = (f"{what} in one launch, {'partial rotary: ' + str(r) + ' of ' + str(d) if r < d else 'full'}"
                        f" head dim" + ((", interleaved pairs " + ("split in registers" if split else "gathered"))
                                        if call.interleaved else ""))
        whys = [f"{block_r} rows of {block_d} columns per program; cos / sin rows read per row (broadcast dims "
                f"stride 0)"]
        if self.copies:
            whys.append(f"{', '.join(self.copies)} copied to contiguous rows first (a strided last dim, or cos and "
                        f"sin laid out differently)")
        self.why = "; ".join(whys)
        self.source, self.measured = choice.source, choice.measured
        self.programs, self.tiles = programs, tiles
        self.full = r == d
        self.tail: tuple[int, ...] | None = None  # the launch's integers: the plan's signature fixes them
        #: after the first launch: the launch of the six tensors alone (``Launcher.hot``: one C call
        #: into the driver where it can), returning whether it launched
        self.hot: Any = None

    def run(self, call: RotaryCall) -> tuple[torch.Tensor, torch.Tensor]:
        """(q_embed, k_embed), or the gradients of q and k for a backward plan, for a call of the
        plan's signature (shapes and strides of q, k, cos, sin)."""
        q, k, cos, sin = call.q, call.k, call.cos, call.sin
        if self.copies:
            if "q" in self.copies:
                q = q.contiguous()
            if "k" in self.copies:
                k = k.contiguous()
            if "cos and sin" in self.copies:
                cos, sin = cos.contiguous(), sin.contiguous()
        qo, ko = _result(q, self.full), _result(k, self.full)  # after the copies: unit column stride
        if self.n_tiles == 0:
            return qo, ko
        if self.hot is not None and self.hot(q, qo, k, ko, cos, sin):
            return qo, ko
        if self.tail is None:
            self.tail = self._tail(q, k, qo, ko, cos, call.rotary_dim, call.unsqueeze_dim)
        self.launcher(q, qo, k, ko, cos, sin, *self.tail)
        if self.hot is None:
            self.hot = self.launcher.hot((q, qo, k, ko, cos, sin, *self.tail), 6)
        return qo, ko

    def _tail(self, q: torch.Tensor, k: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor, cos: torch.Tensor,
              r: int, u: int) -> tuple[int, ...]:
        geo: list[int] = []
        for x, o in ((q, qo), (k, ko)):
            sizes, sx = _leading(x, tuple(x.shape))
            _, so = _leading(o, tuple(o.shape))
            _, sc = _leading(cos.unsqueeze(u), (*x.shape[:-1], r))
            geo += [*sizes, *sx, *so, *sc]
        return (*geo, int(q.shape[-1]), r // 2, self.q_tiles, self.n_tiles, self.grid[0])


# -- autograd --------------------------------------------------------------------------------------
class RotaryFunction(torch.autograd.Function):
    """Forward: the kernel; backward: the kernel's transposed rotation of both gradients in one launch."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze_dim: int, interleaved: bool, run: Any) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(cos, sin)
        ctx.set_materialize_grads(False)  # an unused result's gradient stays None: its input gets none
        ctx.unsqueeze_dim, ctx.interleaved, ctx.q_shape, ctx.k_shape = unsqueeze_dim, interleaved, q.shape, k.shape
        qo, ko = run(q, k, cos, sin, unsqueeze_dim, interleaved)
        qo, ko = owned(qo, q, k, cos, sin), owned(ko, q, k, cos, sin)
        for out, wanted in ((qo, ctx.needs_input_grad[0]), (ko, ctx.needs_input_grad[1])):
            if not wanted:  # as PyTorch's formula: a result requires grad where its input does
                ctx.mark_non_differentiable(out)
        return qo, ko

    @staticmethod
    def backward(ctx: Any, dq: torch.Tensor | None, dk: torch.Tensor | None) -> Any:
        cos, sin = ctx.saved_tensors
        want_q, want_k = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if dq is None and dk is None:
            return None, None, None, None, None, None, None
        gq = dq if dq is not None else torch.zeros((), dtype=cos.dtype, device=cos.device).expand(ctx.q_shape)
        gk = dk if dk is not None else torch.zeros((), dtype=cos.dtype, device=cos.device).expand(ctx.k_shape)
        out_q, out_k = rotary_embedding.transposed(gq, gk, cos, sin, ctx.unsqueeze_dim, ctx.interleaved)
        return (out_q if want_q and dq is not None else None, out_k if want_k and dk is not None else None,
                None, None, None, None, None)


class RotaryEmbedding(Op):
    """``(q_embed, k_embed)``: transformers' rotary position embedding of q and k."""

    name = "rotary_embedding"
    params = (Param("q"), Param("k"), Param("cos"), Param("sin"), Param("unsqueeze_dim", 1, key="value"),
              Param("interleaved", False, key="value"))

    def __init__(self) -> None:
        self._backward_plans: dict[Any, RotaryPlan] = {}
        super().__init__()

    def check(self, q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any = 1, interleaved: Any = False) -> RotaryCall:
        return check(q, k, cos, sin, unsqueeze_dim, interleaved)

    def torch_impl(self, call: RotaryCall) -> Any:
        if call.backward:
            return _torch_transposed(call)
        return torch_rotary(call.q, call.k, call.cos, call.sin, call.unsqueeze_dim, call.interleaved)

    def plan_key(self, call: RotaryCall, backend: Backend) -> Any:
        return plan_key(call, backend)

    def make_plan(self, call: RotaryCall, backend: Backend) -> Plan:
        return RotaryPlan(backend, call)

    def run_plan(self, plan: Plan, call: RotaryCall) -> Any:
        assert isinstance(plan, RotaryPlan)
        return plan.run(call)

    def make_hot(self, plan: Plan, call: RotaryCall, canon: tuple[Any, ...]) -> KernelRoute | None:
        """The signature's route: the plan run with the call's tensors, no check or plan lookup."""
        assert isinstance(plan, RotaryPlan)
        r, device = call.rotary_dim, call.device

        def run(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any, interleaved: Any) -> Any:
            return plan.run(RotaryCall(q, k, cos, sin, unsqueeze_dim, interleaved, r, device, True))

        return KernelRoute(run, plan.variant)

    def autograd(self, canon: tuple[Any, ...], route: Route | None = None) -> Any:
        q, k, cos, sin, u, inter = canon
        if cos.requires_grad or sin.requires_grad:
            return torch_rotary(q, k, cos, sin, u, inter)  # autograd records PyTorch's formula, cos / sin included
        if route is None:  # a first call: checked here; a route's signature was checked when it was made
            call = check(q, k, cos, sin, u, inter)
            if not call.kernel_ok:
                return torch_rotary(q, k, cos, sin, u, inter)
        run = self.forward_of(route, canon, (0, 1, 2, 3, 4, 5), self.call_no_grad)
        return RotaryFunction.apply(q, k, cos, sin, u, inter, run)

    def _compiled(self, canon: tuple[Any, ...]) -> Any:
        """While torch.compile traces: PyTorch's formula, which Inductor fuses itself."""
        return torch_rotary(*canon)

    def compile_cases(self, target):
        from xkernels.ops.fused.rotary_compile import rotary_cases
        return rotary_cases(self, target)

    def transposed(self, gq: torch.Tensor, gk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   unsqueeze_dim: int, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradients of q and k from those of the results (the backward's one launch); the
        plan of each signature (the four tensors' layouts, the backend in effect) kept."""
        key = (_override.get(), unsqueeze_dim, interleaved,
               *((t.shape, t.stride(), t.dtype, t.device) for t in (gq, gk, cos, sin)))
        plan = self._backward_plans.get(key)
        if plan is not None and _forced.get() is None:
            return plan.run(RotaryCall(gq, gk, cos, sin, unsqueeze_dim, interleaved, int(cos.shape[-1]), gq.device,
                                       True, "", True))
        call = check(gq, gk, cos, sin, unsqueeze_dim, interleaved)
        call.backward = True
        route = self._decide(call)[1]
        if not isinstance(route, RotaryPlan):
            return _torch_transposed(call)
        if _forced.get() is None:
            if len(self._backward_plans) >= self.plan_cache_size:
                self._backward_plans.clear()
            self._backward_plans[key] = route
        return route.run(call)

    def _forget(self) -> None:
        super()._forget()
        self._backward_plans.clear()


def _torch_transposed(call: RotaryCall) -> tuple[torch.Tensor, torch.Tensor]:
    """The transposed rotation in PyTorch: the formula with ``-sin`` read at the partner column."""
    half, s = call.rotary_dim // 2, call.sin
    # dx1 = g1 c1 + g2 s2, dx2 = g2 c2 - g1 s1: the formula's "- g2 s'1" and "+ g1 s'2" with s' = -(s2, s1),
    # s1 / s2 the halves or (interleaved) the even / odd columns
    if call.interleaved:
        swapped = s.unflatten(-1, (half, 2)).flip(-1).flatten(-2)
    else:
        swapped = torch.cat((s[..., half:], s[..., :half]), dim=-1)
    return torch_rotary(call.q, call.k, call.cos, -swapped, call.unsqueeze_dim, call.interleaved)


rotary_embedding = RotaryEmbedding()
