"""Which SDPA kernel runs, and how fast, for the attention-mask layouts transformers makes.

Question: under ``torch.compile`` (torch < 2.14) transformers cannot skip an all-true
bidirectional mask, so an encoder's ``scaled_dot_product_attention`` gets a bool mask whose last
dim is broadcast (stride 0). Does SDPA then leave its fused kernels for the float32 math path,
and what do a dense copy of that mask, no mask, or no mask with the masked rows zeroed
(``xkernels.attention_masks.attention``) cost instead? Per layout, eager and compiled:
forward + backward ms (median of ``--reps`` after warm-up) and the kernels the profiler saw.

    python tools/probes/attention_mask_layout.py --batch 16 --heads 12 --seq 512 --dim 64
    python tools/probes/attention_mask_layout.py --host bert-base --host-shape 1x128

``--host MODEL``: instead, what the hooks cost an eager caller: a patched zoo model's inference
forward (bf16, ``--host-shape``), host-synchronized wall time per call, with ``patch()``'s
attention-mask proxies and with them removed, in alternating rounds (medians of each round's
median).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import torch
import torch.nn.functional as F


def masks(b: int, s: int, device) -> dict[str, Any]:
    # transformers' bidirectional mask under compile: a (b, 1, s, s) bool broadcast along batch and kv
    row = torch.ones(1, 1, s, 1, dtype=torch.bool, device=device)
    broadcast = row.expand(b, 1, s, s)
    return {"none": None, "bool stride-0 kv": broadcast, "bool dense": broadcast.contiguous(),
            "by rows": ("rows", broadcast)}


def step(q, k, v, mask, grad):
    if isinstance(mask, tuple):  # ("rows", mask): no mask, the rows the mask drops zeroed (attention_masks.attention)
        rows = mask[1][..., :1]
        out = torch.where(rows, F.scaled_dot_product_attention(q, k, v), q.new_zeros(()))
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(grad)
    return out


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernels(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ranked = sorted(prof.key_averages(), key=lambda e: -getattr(e, "self_device_time_total", 0))
    return [e.key[:90] for e in ranked[:4]]


def host_cost(name: str, batch: int, seq: int, rounds: int = 7, calls: int = 200) -> int:
    import time

    import xkernels
    from xkernels.harness import model_zoo

    dev = torch.device("cuda")
    built = model_zoo.build(model_zoo.zoo_config(name, "base"), f"--model {name}", torch.bfloat16, dev, batch, seq,
                            None, zoo_name=name)
    model = built.model.eval()
    report = xkernels.patch(model)
    from xkernels.attention_masks import AttentionConfig

    proxied = [(m, m.config) for m in model.modules() if isinstance(m.__dict__.get("config"), AttentionConfig)]
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; {name} {batch} x {seq} bf16 forward, "
          f"{report.counts().get('attention mask by rows', 0)} attention-mask proxies")

    def per_call() -> float:
        with torch.no_grad():
            for _ in range(10):
                model(**built.inputs)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                model(**built.inputs)
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) / calls * 1e3

    got: dict[str, list[float]] = {"proxies": [], "own configs": []}
    for _ in range(rounds):
        for way in got:
            for m, proxy in proxied:
                m.__dict__["config"] = proxy if way == "proxies" else proxy._xkernels_config
            got[way].append(per_call())
    for way, ms in got.items():
        print(f"{way:11s} {statistics.median(ms):.4f} ms per forward (rounds {', '.join(f'{t:.4f}' for t in ms)})")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--host", default=None, help="a zoo model: the proxies' host cost in its eager forward")
    p.add_argument("--host-shape", default="1x128", help="BATCHxSEQ for --host")
    args = p.parse_args()
    if args.host:
        return host_cost(args.host, *(int(n) for n in args.host_shape.split("x")))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.seq, args.dim)
    q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    ref = F.scaled_dot_product_attention(*(t.detach().double() for t in (q, k, v)))
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; q/k/v {shape} bf16, forward + backward")
    compiled = torch.compile(step)
    for name, mask in masks(args.batch, args.seq, dev).items():
        for way, fn in (("eager", step), ("compiled", compiled)):
            call = lambda fn=fn, mask=mask: fn(q, k, v, mask, grad)  # noqa: E731
            out = call()
            dev_max = (out.double() - ref).abs().max().item()
            for _ in range(3):
                call()
            ms = timed(call, args.reps)
            print(f"{name:18s} {way:9s} {ms:8.3f} ms  max|dev| vs fp64 {dev_max:.3g}  kernels: {kernels(call)}")
    # rows masked whole (the second half of the first sequence): the math path gives them zeros
    rows = torch.ones(args.batch, 1, args.seq, 1, dtype=torch.bool, device=dev)
    rows[0, :, args.seq // 2:] = False
    with torch.no_grad():
        for name, mask in (("broadcast", rows.expand(-1, -1, -1, args.seq)),
                           ("dense", rows.expand(-1, -1, -1, args.seq).contiguous())):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            dropped = out[0, :, args.seq // 2:]
            print(f"rows masked whole, {name:9s} mask: max |out| there {dropped.abs().max().item():.4g}, "
                  f"finite {bool(dropped.isfinite().all())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
