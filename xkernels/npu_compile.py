"""``python -m xkernels.npu_compile``: the command lives in :mod:`xkernels.cli.npu_compile`."""

import sys

from xkernels.cli.npu_compile import main

if __name__ == "__main__":
    sys.exit(main())
