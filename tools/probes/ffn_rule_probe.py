"""Which TMA config should the FFN up-projection + activation class run at 4K-13K tokens?

Question: the sm90 rules for 768 -> 3072 with an activation at M 4097-10162 and >= 10163 run
persistent 128x128 tiles (5 / 4 stages, measured 0.995x / 1.008x at tuning), while two
`triton.testing.do_bench` probes (H100, 2026-11-23) found the non-persistent 128x128x64 at 3 stages
1.049-1.054x at BERT's 8192 tokens and 1.019x at ViT's 12608. Prediction: with the bench's own
timer (`perf.bench_case`: cache flush, device held, torch in the same run) the 3-stage
non-persistent config beats the rule's on both classes and both dtypes, by a few percent.

Each case (BERT 8192 and ViT 64 x 197 tokens; gelu and silu; bf16 and fp16) is timed with every
config twice, in alternating order, and with the config the tables pick. Config labels: ``p1`` /
``p0`` persistent or not, ``s<N>`` N pipeline stages, ``sub1`` the subtiled epilogue. Output:
results/2026-11-23-h100-ffn-tiles (8192 and 12608 tokens), results/2026-11-23-h100-ffn-tiles-2048.

    python tools/probes/ffn_rule_probe.py [--tokens 8192,12608]
"""

import argparse
import statistics

import torch

from xkernels import tuning
from xkernels.harness import perf, resolve_target
from xkernels.harness.cases import Case, T

BASE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "TMA": True}
CONFIGS = {
    "rule (tables)": None,
    "p1 s5 sub1": {**BASE, "num_stages": 5, "PERSISTENT": True, "EPILOGUE_SUBTILE": True},
    "p1 s4": {**BASE, "num_stages": 4, "PERSISTENT": True},
    "p0 s3": {**BASE, "num_stages": 3},
    "p0 s3 sub1": {**BASE, "num_stages": 3, "EPILOGUE_SUBTILE": True},
    "p0 s4": {**BASE, "num_stages": 4},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="8192,12608", help="comma-separated token counts (M)")
    tokens = [int(t) for t in ap.parse_args().tokens.split(",")]
    target = resolve_target("cuda", None)
    ceil = perf.ceilings(target)
    for dtype in (torch.bfloat16, torch.float16):
        for m in tokens:
            for act in ("gelu", "silu"):
                case = Case("linear", (T((m, 768), dtype), T((3072, 768), dtype), T((3072,), dtype), act),
                            f"ffn up + {act}", frozenset({"probe"}))
                res = {name: [] for name in CONFIGS}
                for rnd in range(2):
                    for name in (CONFIGS if rnd == 0 else list(CONFIGS)[::-1]):
                        cfg = CONFIGS[name]
                        if cfg is None:
                            row = perf.bench_case(case, target, ceil, seed=rnd)
                        else:
                            with tuning.force(cfg):
                                row = perf.bench_case(case, target, ceil, seed=rnd)
                        res[name].append(row["speedup"])
                line = "  ".join(f"{n} {statistics.mean(v):.3f}" for n, v in res.items())
                print(f"{str(dtype)[6:]:8} M={m:5} {act:5} {line}", flush=True)


if __name__ == "__main__":
    main()
