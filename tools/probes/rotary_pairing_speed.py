"""Device µs of ``rotary_embedding`` pairing the halves against pairing adjacent columns, at the
same shapes (bf16, q / k as transformers lays them out, L2 flushed before each call, interleaved
rounds), forward and the backward's transposed rotation; with the achieved bandwidth.

    python tools/probes/rotary_pairing_speed.py --shapes 1:2048:64:8:128:128,1:2048:32:2:128:64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from xkernels.ops import rotary_embedding
from xkernels.ops.fused import rotary


def main(argv=None) -> int:
    from triton.testing import do_bench

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1:2048:32:8:128:128,1:2048:64:8:128:128,1:2048:32:2:128:64,16:512:32:8:128:128")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args(argv)
    dev, bf = torch.device("cuda"), torch.bfloat16
    rows = []
    for spec in args.shapes.split(","):
        b, s, h, hk, d, r = (int(v) for v in spec.split(":"))
        q = torch.randn(b, s, h * d, device=dev).to(bf).view(b, s, h, d).transpose(1, 2)
        k = torch.randn(b, s, hk * d, device=dev).to(bf).view(b, s, hk, d).transpose(1, 2)
        cos, sin = torch.rand(1, s, r, device=dev).to(bf), torch.rand(1, s, r, device=dev).to(bf)
        moved = 2 * (q.numel() + k.numel()) * q.element_size()
        fns = {}
        for pairs in (False, True):
            fns[("forward", pairs)] = lambda pairs=pairs: rotary_embedding(q, k, cos, sin, 1, pairs)
            fns[("backward", pairs)] = lambda pairs=pairs: rotary.rotary_embedding.transposed(q, k, cos, sin, 1, pairs)
        per = {key: [] for key in fns}
        for i in range(args.rounds):
            for key in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
                per[key].append(do_bench(fns[key], warmup=10, rep=50, return_mode="median") * 1e3)
        for (what, pairs), v in per.items():
            us = statistics.median(v)
            row = {"shape": spec, "pass": what, "pairs": "adjacent" if pairs else "halves", "us": us,
                   "min_us": min(v), "max_us": max(v), "TB/s": moved / us / 1e6}
            rows.append(row)
            print(f"{spec:22s} {what:8s} {row['pairs']:8s} {us:8.2f} us [{min(v):.2f}-{max(v):.2f}]  "
                  f"{row['TB/s']:.2f} TB/s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
