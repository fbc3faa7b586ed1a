"""A VLM's vision tower patched against torch's, eager: Qwen2.5-VL's (``apply_rotary_pos_emb_vision``
on (tokens, heads, d) q / k, RMSNorms, window and full attention), random weights at the 7B
model's vision width (32 blocks, hidden 1280, 16 heads), bf16. Per way, each on its own copy:
wall ms per forward (10 forwards, synchronized) in interleaved rounds, inference and a training
step; on cuda the kernels' own time per forward / step (profiler: the tower's per-window attention
calls make it host-bound); the fusions patch() made; max |patched - torch| of the output
(``--reference``: each way's against the float64 tower).

    python tools/probes/vision_tower_probe.py --images 4 --side 32 --json vision-tower.json
    python tools/probes/vision_tower_probe.py --reference --rounds 1   # each way against float64
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

import xkernels


def build(depth: int):
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as vl

    cfg = vl.Qwen2_5_VLVisionConfig(depth=depth, hidden_size=1280, intermediate_size=3420, num_heads=16,
                                    out_hidden_size=3584, patch_size=14, spatial_merge_size=2,
                                    temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return vl.Qwen2_5_VisionTransformerPretrainedModel(cfg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--side", type=int, default=32, help="patches per image side (32: 448 x 448 pixels)")
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reference", action="store_true", help="each way's error against the float64 tower")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    base = build(args.depth).to(dev, torch.bfloat16)
    mine = copy.deepcopy(base)
    report = xkernels.patch(mine)
    grid = torch.tensor([[1, args.side, args.side]] * args.images, device=dev)
    torch.manual_seed(1)
    x = torch.randn(args.images * args.side * args.side, 3 * 2 * 14 * 14, device=dev, dtype=torch.bfloat16)
    ways = {"torch": base, "patch": mine}

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def forward(m):
        with torch.no_grad():
            return m(x, grid_thw=grid).last_hidden_state

    def train(m):
        m.zero_grad(set_to_none=True)
        m(x, grid_thw=grid).last_hidden_state.float().square().mean().backward()

    outs = {w: forward(m) for w, m in ways.items()}
    diff = (outs["torch"].float() - outs["patch"].float()).abs().max().item()
    scale = outs["torch"].float().abs().max().item()
    ref_err = {}
    if args.reference:  # each way's error against the float64 tower on the same inputs
        ref = build(args.depth).to(dev, torch.float64)
        with torch.no_grad():
            want = ref(x.double(), grid_thw=grid).last_hidden_state
        ref_err = {w: (o.double() - want).abs().max().item() for w, o in outs.items()}
        print(f"max|way - float64|: {ref_err}")
        del ref, want
    kernel_ms = {}
    if dev.type == "cuda":  # the kernels' own time (profiler): the tower's window attention makes it host-bound
        from torch.profiler import ProfilerActivity, profile

        for w, m in ways.items():
            for p, fn in (("forward", forward), ("train", train)):
                fn(m)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        fn(m)
                    torch.cuda.synchronize()
                total = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type.name == "CUDA")
                kernel_ms[(w, p)] = total / 3 / 1e3
        for p in ("forward", "train"):
            t, m = kernel_ms[("torch", p)], kernel_ms[("patch", p)]
            print(f"{p} kernels: torch {t:.3f} ms, patch {m:.3f} ms: {t / m:.3f}x")
    times = {(w, p): [] for w in ways for p in ("forward", "train")}
    for r in range(args.rounds):
        for w in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            for p, fn in (("forward", forward), ("train", train)):
                fn(ways[w])
                sync()
                t = time.perf_counter()
                for _ in range(args.calls):
                    fn(ways[w])
                sync()
                times[(w, p)].append((time.perf_counter() - t) / args.calls * 1e3)
    rows = []
    for p in ("forward", "train"):
        t, m = statistics.median(times[("torch", p)]), statistics.median(times[("patch", p)])
        rows.append({"pass": p, "torch_ms": t, "patch_ms": m, "speedup": t / m,
                     "torch_range": [min(times[("torch", p)]), max(times[("torch", p)])],
                     "patch_range": [min(times[("patch", p)]), max(times[("patch", p)])]})
        print(f"{p}: torch {t:.3f} ms [{rows[-1]['torch_range'][0]:.3f}-{rows[-1]['torch_range'][1]:.3f}], "
              f"patch {m:.3f} ms [{rows[-1]['patch_range'][0]:.3f}-{rows[-1]['patch_range'][1]:.3f}]: {t / m:.3f}x")
    print(f"fusions {report.counts()}; left {len(report.left)}; max|patch - torch| {diff:.3g} (max|torch| {scale:.3g})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "tokens": x.shape[0], "fusions": report.counts(),
                       "left": [m.reason for m in report.left], "max_abs_diff": diff, "max_abs": scale,
                       "max_abs_error_against_float64": ref_err,
                       "kernel_ms": {f"{w} {p}": v for (w, p), v in kernel_ms.items()},
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
