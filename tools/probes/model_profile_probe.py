"""Where a patched model's forward time goes: BERT-base 16 x 512 bf16, torch eager against
``xkernels.patch(model)``, under ``torch.profiler`` (device time per kernel name) and with plain
CUDA events over back-to-back forwards (no held timer: host gaps show).

Question: the s5 model bench showed the patched BERT forward at 0.72x torch while its linears, one
by one in the corpus bench, run at 0.98-1.02x. Is the loss in kernels (device time) or in gaps
(host time per call)?

    python tools/probes/model_profile_probe.py [--model bert-base] [--batch 16] [--seq 512]
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import xkernels
from xkernels.cli import bench_models


def forward_ms(model, ids, n=20):
    with torch.no_grad():
        for _ in range(3):
            model(ids)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            model(ids)
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def device_table(model, ids, label):
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            model(ids)
        torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(e.device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / 3e3
    print(f"--- {label}: device time per forward {total:.3f} ms (kernels only)")
    print(events.table(sort_by="device_time_total", row_limit=12, max_name_column_width=70))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-base")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    args = ap.parse_args()
    dev = torch.device("cuda")
    built = bench_models.build(args.model, "base", args.batch, args.seq, torch.bfloat16, dev, 0)
    model, ids = built.model.eval(), built.ids
    print(f"torch eager: {forward_ms(model, ids):.3f} ms per forward (CUDA-synchronised wall)")
    device_table(model, ids, "torch eager")
    report = xkernels.patch(model)
    print(f"patch: {len(report.replaced)} replaced, {len(report.fused)} fused, {len(report.left)} left")
    print(f"patched: {forward_ms(model, ids):.3f} ms per forward (CUDA-synchronised wall)")
    device_table(model, ids, "patched")
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        for _ in range(5):
            model(ids)
        torch.cuda.synchronize()
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print("--- patched, host (cProfile, 5 forwards, sorted by own time)")
    print(out.getvalue())


if __name__ == "__main__":
    main()
