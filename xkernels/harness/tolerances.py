"""How far a result may be from the float64 reference, per dtype, op and backend, with sources.

An element passes when ``|out - ref| <= atol + rtol*|ref| + dot*mag`` where ``ref`` is the
float64 reference cast back to the result dtype. ``dot*mag`` is zero for element-wise ops; for
matmul/linear, ``mag = (|A| @ |B|)_ij`` (+ ``|bias|``), the magnitude every rounding error of
an inner product is proportional to, and

    dot = L_act * (2*operand_u + min(K, 4*sqrt(K)) * accum_u)

* ``operand_u``: unit roundoff the matrix unit rounds operands to before multiplying (0 when the
  products are exact in the accumulator: fp16/bf16 into fp32; 2**-11 for TF32);
* ``accum_u``: unit roundoff of the accumulator (fp32: 2**-24); ``K*u`` is the worst-case
  bound, ``lambda*sqrt(K)*u`` the probabilistic one (lambda = 4) for random data;
* ``L_act``: the activation's largest slope (errors before it are scaled by at most that).

A backend that runs PyTorch (``runs_triton`` False) computes ``linear`` unfused: the
pre-activation is rounded to the result dtype before the activation, which adds
``L_act * u_dtype`` to ``dot`` (``intermediate_u``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from xkernels.backend import Backend

TORCH_TESTING = ("torch.testing.assert_close default rtol/atol for {dtype} "
                 "(https://pytorch.org/docs/stable/testing.html#torch.testing.assert_close)")
HIGHAM = ("inner-product rounding error: |fl(x.y) - x.y| <= gamma_K |x|.|y| (Higham, Accuracy and Stability "
          "of Numerical Algorithms, 2nd ed., eq. 3.5); probabilistic lambda*sqrt(K)*u (Higham & Mary, "
          "SIAM J. Sci. Comput. 41(5), 2019, doi:10.1137/18M1226312)")
TF32 = ("TF32 keeps 10 explicit mantissa bits, unit roundoff 2^-11, products accumulated in fp32 "
        "(https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices)")
LAMBDA = 4.0
FP32_U = 2.0**-24
TF32_U = 2.0**-11


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    source: str
    operand_u: float = 0.0
    accum_u: float = 0.0
    intermediate_u: float = 0.0
    #: linear with a residual: the vendor and PyTorch routes round act(x @ W.T + b) to the dtype
    #: before adding it (the kernels round once)
    residual_u: float = 0.0
    #: PyTorch's rotary formula in the result dtype rounds x * cos and rotate_half(x) * sin to it
    #: before their sum (the kernel keeps them in fp32)
    product_u: float = 0.0

    def dot_coefficient(self, k: int, activation: str | None = None, residual: bool = False) -> float:
        """The factor of ``mag`` (``|A|@|B|``) allowed for an inner product of length ``k``."""
        if not (self.operand_u or self.accum_u):
            return 0.0
        terms = min(float(k), LAMBDA * math.sqrt(k)) if k else 0.0
        rounded = (self.intermediate_u if activation is not None else 0.0) + (self.residual_u if residual else 0.0)
        rounded += self.product_u
        return ACTIVATION_SLOPE[activation][0] * (2 * self.operand_u + terms * self.accum_u + rounded)

    def describe(self, k: int | None = None, activation: str | None = None, residual: bool = False,
                 magnitude: str = "|A||B|") -> str:
        text = f"rtol {self.rtol:.1e} atol {self.atol:.0e}" if self.rtol or self.atol else "exact"
        if activation == "relu2":  # its slope is carried by the magnitude (ACTIVATION_SLOPE)
            magnitude = f"*2({magnitude})^2"
        if k is not None and self.dot_coefficient(k, activation, residual):
            text += f" +{self.dot_coefficient(k, activation, residual):.1e}{magnitude}"
        return text


def _torch_default(dtype: torch.dtype, rtol: float, atol: float) -> Tolerance:
    return Tolerance(rtol, atol, TORCH_TESTING.format(dtype=str(dtype).removeprefix("torch.")))


_EXACT = "integers are exact: no rounding in integer add (the harness keeps values far from overflow)"

#: Element-wise ops (broadcast, add) by result dtype.
ELEMENTWISE: dict[torch.dtype, Tolerance] = {
    torch.float16: _torch_default(torch.float16, 1e-3, 1e-5),
    torch.bfloat16: _torch_default(torch.bfloat16, 1.6e-2, 1e-5),
    torch.float32: _torch_default(torch.float32, 1.3e-6, 1e-5),
    torch.float64: _torch_default(torch.float64, 1e-7, 1e-7),
    **{d: Tolerance(0.0, 0.0, _EXACT) for d in (torch.int8, torch.int16, torch.int32, torch.int64,
                                                torch.uint8, torch.bool)},
}

#: matmul / linear by (result dtype, fp32 matmul precision of the backend: "ieee" or "tf32").
MATMUL: dict[tuple[torch.dtype, str], Tolerance] = {
    (torch.float16, "ieee"): Tolerance(1e-3, 1e-5, f"{TORCH_TESTING.format(dtype='float16')}; fp16 products "
                                       f"exact in the fp32 accumulator; {HIGHAM}", 0.0, FP32_U),
    (torch.bfloat16, "ieee"): Tolerance(1.6e-2, 1e-5, f"{TORCH_TESTING.format(dtype='bfloat16')}; bf16 products "
                                        f"exact in the fp32 accumulator; {HIGHAM}", 0.0, FP32_U),
    (torch.float32, "ieee"): Tolerance(1.3e-6, 1e-5, f"{TORCH_TESTING.format(dtype='float32')}; fp32 products "
                                       f"and accumulation (gamma_K counts the product roundings); {HIGHAM}", 0.0, FP32_U),
    (torch.float32, "tf32"): Tolerance(1.3e-6, 1e-5, f"{TORCH_TESTING.format(dtype='float32')}; {TF32}; "
                                       f"{HIGHAM}", TF32_U, FP32_U),
}

NORM_STATS = ("statistics (mean, variance / mean square) are sums of N terms accumulated in fp32: the inner-product "
              "bound with operand_u = 0 (the terms are exact in fp32), applied to the magnitude "
              "(|s - mean| + mean|s|) * rstd * |w| that an error in the mean or in rstd scales; " + HIGHAM)

#: add_layer_norm / add_rms_norm's y by result dtype: the element-wise tolerance of the dtype (one
#: rounding of y) plus the fp32 statistics' rounding over N (``mag`` from the harness reference).
NORM: dict[torch.dtype, Tolerance] = {
    d: dataclasses.replace(ELEMENTWISE[d], source=f"{ELEMENTWISE[d].source}; {NORM_STATS}",
                           accum_u=2.0**-53 if d == torch.float64 else FP32_U)
    for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
}
NORM_OPS = ("add_layer_norm", "add_rms_norm")

ROTARY_ROUNDING = ("each element of q_embed / k_embed is x_i cos_i -+ x_j sin_i: two products and their sum in fp32 "
                   "inside the kernel (fp16 / bf16 products are exact in fp32), rounded once at the store (the "
                   "element-wise tolerance of the dtype); the fp32 roundings: the inner-product bound with K = 2 "
                   "terms and operand_u = 0, 2 u_fp32 of the magnitude |x_i cos_i| + |x_j sin_i| (0 on the columns "
                   "partial rotary passes on); " + HIGHAM)

#: rotary_embedding's q_embed and k_embed by result dtype: one rounding at the store (the
#: element-wise tolerance) plus the fp32 products and sum over ``mag`` (from the harness reference).
ROTARY: dict[torch.dtype, Tolerance] = {
    d: dataclasses.replace(ELEMENTWISE[d], source=f"{ELEMENTWISE[d].source}; {ROTARY_ROUNDING}",
                           accum_u=2.0**-53 if d == torch.float64 else FP32_U)
    for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
}
ROTARY_OPS = ("rotary_embedding",)

#: Whole models and training runs (many ops, each rounding): the result is compared with the same
#: model run in float64, and xkernels' error may be at most ``ratio`` times the error of the same
#: model run by PyTorch in the same dtype, plus ``atol``: both round at the same points (one dtype
#: per op), so their errors are of one order and differ by summation order and fused epilogues.
MODEL_ERROR_RATIO = (LAMBDA, "errors of one order: the probabilistic inner-product bound's lambda = 4 "
                             "(Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019, doi:10.1137/18M1226312) "
                             "as the allowed factor between two summation orders")


#: Largest |f'(x)| of each linear activation, with where it comes from.
ACTIVATION_SLOPE: dict[str | None, tuple[float, str]] = {
    None: (1.0, "identity"),
    "relu": (1.0, "relu' is 0 or 1"),
    "leaky_relu": (1.0, "leaky_relu' is 1 or negative_slope (harness slopes are <= 1)"),
    "gelu": (1.13, "GELU (erf form) x*Phi(x): max slope 1.129 at x = sqrt(2) (d/dx = Phi + x*phi)"),
    "silu": (1.1, "SiLU x*sigmoid(x): max slope 1.0998 at x = 2.3994"),
    "gelu_tanh": (1.13, "GELU tanh form 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))): max slope 1.129 at x = 1.4185 "
                        "(d/dx of torch.nn.functional.gelu(approximate='tanh') over [-5, 5] in float64)"),
    "quick_gelu": (1.1, "QuickGELU x*sigmoid(1.702x): SiLU's slope at u = 1.702x, max 1.0998 at x = 1.4097"),
    "relu2": (1.0, "relu(x)^2: slope 2 relu(x), unbounded; carried by the magnitude instead, 2 m^2 for "
                   "m = |A||B| (harness/accuracy.py's reference)"),
}


#: Unit roundoff of each float dtype (half the gap between 1 and the next number).
UNIT_ROUNDOFF: dict[torch.dtype, tuple[float, str]] = {
    torch.float16: (2.0**-11, "IEEE 754 binary16: 10 explicit mantissa bits"),
    torch.bfloat16: (2.0**-8, "bfloat16: 7 explicit mantissa bits"),
    torch.float32: (2.0**-24, "IEEE 754 binary32: 23 explicit mantissa bits"),
}
UNFUSED = "PyTorch's unfused F.linear + activation rounds the pre-activation to the result dtype ({u})"
RESIDUAL_ROUNDED = ("with a residual, the vendor-BLAS and PyTorch routes round act(x @ W.T + b) to the result "
                    "dtype before adding it ({u}; a promoting residual is not in the harness cases)")
ROTARY_TORCH = ("a backend that runs PyTorch computes the rotary formula in the result dtype: x * cos and "
                "rotate_half(x) * sin each rounded to it before their sum, u (1 + u) of the magnitude ({u}; the "
                "u^2: the sum's rounding of those errors)")
GATED_ROUNDED = ("gated_linear's vendor route and PyTorch round gate and up to the result dtype before "
                 "act(gate) * up ({u}); the magnitude is |up| * (|x|@|Wg|.T + |bg|) + |act(gate)| * "
                 "(|x|@|Wu|.T + |bu|)")


def tolerance(op: str, dtype: torch.dtype, backend: Backend) -> Tolerance:
    """The tolerance for ``op`` producing ``dtype`` on ``backend`` (KeyError if none is defined)."""
    if op in NORM_OPS:
        return NORM[dtype]
    if op in ROTARY_OPS:
        tol = ROTARY[dtype]
        if backend.runs_triton or dtype in (torch.float32, torch.float64):  # fp32 in: torch's products are fp32 too
            return tol
        u, why = UNIT_ROUNDOFF[dtype]
        return dataclasses.replace(tol, product_u=u * (1 + u), source=f"{tol.source}; {ROTARY_TORCH.format(u=why)}")
    if op not in ("matmul", "linear", "gated_linear"):
        return ELEMENTWISE[dtype]
    precision = backend.fp32_matmul_precision() if dtype == torch.float32 else "ieee"
    tol = MATMUL[(dtype, precision)]
    if op == "linear" and not backend.runs_triton or op == "gated_linear":
        u, why = UNIT_ROUNDOFF[dtype]
        text = GATED_ROUNDED.format(u=why) if op == "gated_linear" else UNFUSED.format(u=why)
        tol = dataclasses.replace(tol, intermediate_u=u, source=f"{tol.source}; {text}")
    if op == "linear":
        u, why = UNIT_ROUNDOFF[dtype]
        tol = dataclasses.replace(tol, residual_u=u, source=f"{tol.source}; {RESIDUAL_ROUNDED.format(u=why)}")
    return tol
