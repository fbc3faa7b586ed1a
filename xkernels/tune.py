"""``python -m xkernels.tune``: the command lives in :mod:`xkernels.cli.tune`."""

import sys

from xkernels.cli.tune import main

if __name__ == "__main__":
    sys.exit(main())
