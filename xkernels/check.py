"""``python -m xkernels.check``: the command lives in :mod:`xkernels.cli.check`."""

import sys

from xkernels.cli.check import main

if __name__ == "__main__":
    sys.exit(main())
