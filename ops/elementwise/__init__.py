"""The element-wise family: ``add`` (``torch.add``) and ``broadcast`` (``x + bias``, bias
broadcast to x). ``binary.py``: the host side (layout analysis, variant and config, launch);
``kernels.py``: the Triton sources."""

from xkernels.ops.elementwise.add import add
from xkernels.ops.elementwise.broadcast import broadcast

__all__ = ["add", "broadcast"]
