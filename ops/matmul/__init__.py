"""The matmul family: ``matmul`` (``torch.matmul``) and ``linear`` (``F.linear`` + activation,
fused into the epilogue).

``ops.py``: the ops' front (checks, call record, PyTorch fallback); ``config.py``: which config a
call runs and why (tables, wave model); ``plan.py``: how it launches; ``hot.py``: repeated calls;
``kernels.py``: the Triton sources; ``vendor.py``: the computations with PyTorch's own ops.
"""

from xkernels.ops.matmul.ops import ACTIVATIONS, MATMUL_DEFAULT, Linear, Matmul, MatmulCall, linear, matmul
from xkernels.ops.matmul.vendor import reference_linear

__all__ = ["ACTIVATIONS", "MATMUL_DEFAULT", "Linear", "Matmul", "MatmulCall", "linear", "matmul", "reference_linear"]
