"""``python -m xkernels.bench``: the command lives in :mod:`xkernels.cli.bench`."""

import sys

from xkernels.cli.bench import main

if __name__ == "__main__":
    sys.exit(main())
