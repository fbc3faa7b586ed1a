"""Host time of linear calls whose plan is the TMA kernel, at few tokens (launch-bound).

Question: the held-out Gemma-2B qkv (2048 -> 2560) at 77 tokens runs a 64x64x128 TMA kernel of
12.9 us device time, kept by the launch-bound exception of the wave model (its host cost was
assumed to be a pointer kernel's ~9 us), yet took 36.9 us wall per back-to-back call against
F.linear's 20.8 (s9/3). Prediction: TMA plans pay for tensor descriptors on the host each call
(or have no hot entry at all), several times a pointer kernel's launch.

For each shape: the plan (explain), whether a hot entry exists and what it is, wall us per
back-to-back call of xkernels and F.linear in alternating rounds, the same with the TMA
candidate excluded (a forced pointer config of the same tile), and a cProfile of the call.

    python tools/probes/tma_launch_probe.py
"""

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from xkernels import tuning
from xkernels.ops import linear

sys.path.insert(0, str(Path(__file__).parent))
from forms_host_probe import wall_us  # noqa: E402  (the same alternating-rounds timer)

SHAPES = [(77, 2048, 2560, False), (1, 768, 768, True), (128, 768, 2304, True), (128, 768, 768, True),
          (512, 768, 768, True)]


def main() -> None:
    d = torch.device("cuda")
    for m, k, n, bias in SHAPES:
        x = torch.randn(m, k, device=d, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=d, dtype=torch.bfloat16)
        b = torch.randn(n, device=d, dtype=torch.bfloat16) if bias else None
        e = linear.explain(x, w, b)
        linear(x, w, b)
        linear(x, w, b)
        entry = linear.hot_entry(x, w, b)
        xk_us, th_us = wall_us(lambda: linear(x, w, b), lambda: F.linear(x, w, b))
        cfg = {k2: v for k2, v in e.config.items() if k2 in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps",
                                                             "num_stages", "GROUP_M")}
        with tuning.force(cfg):
            linear(x, w, b)
            ptr_us, = wall_us(lambda: linear(x, w, b))
        print(f"M={m} {k}->{n} bias={bias}: {e.route} {e.config}\n  hot entry: {getattr(entry, '__qualname__', entry)}"
              f"\n  wall/call xk {xk_us:.1f} us  F.linear {th_us:.1f} us  same tile forced as a pointer kernel "
              f"(full path, no hot entry while forced) {ptr_us:.1f} us", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            linear(x, w, b)
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(10)
        print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[-2200:], flush=True)


if __name__ == "__main__":
    main()
