"""Short rows: a (C, 1, 1) channel bias over NCHW activations (ResNet-50) makes the tiled
element-wise kernel's rows H*W long (49 at layer4). ``broadcast`` fp32 at 32x2048x7x7 ran at
0.42x torch in the element-wise corpus bench (H100, 2026-11-23) (BLOCK_M 256 x BLOCK_N 64 after the row-length reshape of the
table's 8 x 2048 tile, 4 warps).

Question: which tile shapes and warp counts suit short rows, per dtype, and does one choice
hold across the four ResNet stages? Prediction: fewer elements per thread (<= 32) recovers >= 1x.

    python tools/probes/short_rows_probe.py --json short_rows.json

Output: results/2026-11-23-h100-short-rows (the fp32 short-row rules of the cuda add/broadcast
tables cite it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

from xkernels import tuning
from xkernels.harness import perf, resolve_target
from xkernels.ops import add, broadcast

SHAPES = [(32, 2048, 7, 7), (32, 1024, 14, 14), (32, 512, 28, 28), (32, 256, 56, 56)]
CONFIGS = [{"BLOCK_M": m, "BLOCK_N": n, "num_warps": w}
           for (m, n), w in itertools.product([(8, 2048), (32, 256), (64, 64), (32, 64), (16, 64), (128, 64),
                                               (16, 256), (8, 256), (4, 1024), (1, 2048)], [2, 4, 8])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    target = resolve_target(None, None)
    settings = perf.Settings(budget_s=0.3, warmup_s=0.05)
    rows = []
    for dtype, shape, opname in itertools.product([torch.float32, torch.bfloat16], SHAPES, ["broadcast", "add"]):
        gen = torch.Generator(device=target.device).manual_seed(0)
        sets = [(torch.randn(shape, generator=gen, device=target.device).to(dtype),
                 torch.randn((shape[1], 1, 1), generator=gen, device=target.device).to(dtype)) for _ in range(4)]
        fn = broadcast if opname == "broadcast" else add
        th = perf.time_calls(lambda s: s[0] + s[1], sets, target, settings).median_ms
        default = perf.time_calls(lambda s: fn(*s), sets, target, settings).median_ms
        res = []
        for cfg in CONFIGS:
            with tuning.force(cfg):
                got = fn(*sets[0])
                ok = torch.equal(got, sets[0][0] + sets[0][1])
                ms = perf.time_calls(lambda s: fn(*s), sets, target, settings).median_ms
            res.append({"cfg": cfg, "ms": ms, "ok": ok, "ratio": th / ms})
        best = max(res, key=lambda r: r["ratio"])
        print(f"{opname:9} {str(dtype)[6:]:8} {'x'.join(map(str, shape)):14} torch {th * 1e3:7.1f} us  "
              f"table {th / default:.2f}x  best {best['ratio']:.2f}x {best['cfg']}", flush=True)
        rows.append({"op": opname, "dtype": str(dtype)[6:], "shape": shape, "torch_ms": th, "table_ms": default,
                     "configs": res})
    args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
