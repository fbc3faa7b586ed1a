"""Where the host time of the rotary fusion's calls goes on a GPU host: host µs per call (the
device held busy) of ``rotary_embedding`` called directly in each pairing and width, and of the
function ``patch()`` binds for Cohere's and GLM's forms, in interleaved rounds; then a cProfile of
each way's calls.

    python tools/probes/rotary_host_split.py --json host-split.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time

import torch

from xkernels import rotary_fusion as rf
from xkernels.ops import rotary_embedding

HOLD_CYCLES = 40_000_000
CALLS = 200


def operands(b, s, h, hk, d, r, pairs, device):
    bf = torch.bfloat16
    q = torch.randn(b, s, h * d, device=device).to(bf).view(b, s, h, d).transpose(1, 2)
    k = torch.randn(b, s, hk * d, device=device).to(bf).view(b, s, hk, d).transpose(1, 2)
    f = torch.arange(s, device=device, dtype=torch.float32)[None, :, None] * torch.rand(r // 2, device=device)
    emb = f.repeat_interleave(2, dim=-1) if pairs else torch.cat((f, f), dim=-1)
    return q, k, emb.cos().to(bf), emb.sin().to(bf)


def ways(device):
    from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb as cohere
    from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as glm

    full = operands(1, 16, 32, 8, 128, 128, False, device)
    pairs = operands(1, 16, 32, 8, 128, 128, True, device)
    part = operands(1, 16, 32, 2, 128, 64, False, device)
    fc = rf.fused_rotary(cohere, rf.Form(False, interleaved=True))
    fg = rf.fused_rotary(glm, rf.Form(True, halved=True, interleaved=True))
    half = tuple(t[..., :32].repeat_interleave(2, dim=-1) for t in part[2:])
    return {
        "op, halves, full width (Llama)": lambda: rotary_embedding(*full),
        "op, pairs, full width, interleaved=True positional": lambda: rotary_embedding(*pairs, 1, True),
        "op, pairs, full width, interleaved=True keyword": lambda: rotary_embedding(*pairs, interleaved=True),
        "Cohere's form as patch() binds it": lambda: fc(*pairs),
        "op, halves, partial 64 of 128": lambda: rotary_embedding(*part),
        "op, pairs, partial 64 of 128 (GLM's call, cos made)": lambda: rotary_embedding(*part[:2], *half, 1, True),
        "GLM's form as patch() binds it": lambda: fg(*part),
        "transformers' Cohere function": lambda: cohere(*pairs),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--json")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    fns = ways(device)
    per = {n: [] for n in fns}
    with torch.no_grad():
        for f in fns.values():
            for _ in range(20):
                f()
        torch.cuda.synchronize()
        for i in range(args.rounds):
            for n in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
                torch.cuda._sleep(HOLD_CYCLES)
                t0 = time.perf_counter()
                for _ in range(CALLS):
                    fns[n]()
                per[n].append((time.perf_counter() - t0) / CALLS * 1e6)
                torch.cuda.synchronize()
        profiles = {}
        for n, f in fns.items():
            prof = cProfile.Profile()
            torch.cuda._sleep(HOLD_CYCLES)
            prof.enable()
            for _ in range(CALLS):
                f()
            prof.disable()
            torch.cuda.synchronize()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
            profiles[n] = out.getvalue()
    rows = {n: {"median_us": statistics.median(v), "min_us": min(v)} for n, v in per.items()}
    for n, r in rows.items():
        print(f"{n:55s} median {r['median_us']:7.2f} us  min {r['min_us']:7.2f} us")
    for n, text in profiles.items():
        print(f"\n== {n}\n{text}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
