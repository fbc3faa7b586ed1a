"""``python -m xkernels.tune`` with a timer fixed by what it times, for tests of the sweep's merge:

    torchrun --nproc-per-node 2 tests/tune_fixed_timer.py --backend interpreter --op add --shapes quick ...

Every call still runs once (and is checked by the sweep); its "time" is a function of the case
and config alone, so one process and several must choose the same rules.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Callable
from typing import Any


def fixed_timer(fn: Callable[[], Any], label: dict[str, Any]) -> float:
    fn()
    return 0.01 + zlib.crc32(json.dumps(label, sort_keys=True).encode()) % 997 / 1e4


if __name__ == "__main__":
    from xkernels.cli import tune

    sys.exit(tune.main(sys.argv[1:], timer=fixed_timer))
