"""The kernels of one eager call of a zoo model against one CUDA-graph replay of it, captured as
``bench --mode cudagraph`` captures it (``xkernels.harness.model_runs.captured_forward`` /
``captured_step``, transformers' mask decisions as in eager) and, with ``--plain``, captured as
the bench did before (the model called bare inside ``torch.cuda.graph``).

Question: BERT-base's replays measured 20 / 45 ms (forward / forward+backward) against 4 / 15 ms
of eager device time (results/2026-11-24-h100-model-modes, transformers 5.17). Prediction: the
plain capture holds a materialized attention mask and a masked SDPA kernel (no flash kernel) in
every layer, plus the mask's construction, and those kernels make up the difference; the
bench's capture holds the eager call's kernels, its total within a few percent of eager's.

    python tools/probes/capture_kernels.py [--model bert-base|config.json] [--batch B --seq S]
        [--pass forward|step] [--plain] [--patch] [--top 15]

Prints, per variant (eager, graph; plain graph with ``--plain``): the total device time of the
call's kernels, the kernel count, and the top kernels by device time (torch.profiler); then
each variant's attention kernels (names with attention / fmha / flash / softmax).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-base", help="a zoo model, or a transformers config.json path")
    ap.add_argument("--pass", dest="which", choices=["forward", "step"], default="forward")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--plain", action="store_true", help="also the capture of the bare model call")
    ap.add_argument("--patch", action="store_true", help="xkernels.patch the model first")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--batch", type=int, default=None, help="the zoo's default when not given")
    ap.add_argument("--seq", type=int, default=None, help="the zoo's default when not given")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from xkernels.harness import model_zoo
    from xkernels.harness.model_runs import Runner, _capture, captured_forward, captured_step, loss_of

    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    if args.model.endswith(".json"):  # a transformers config.json, as bench --model-config takes it
        from xkernels.cli import bench_models

        spec = bench_models.file_spec(args.model)
        built = model_zoo.build(spec.data, spec.source, getattr(torch, args.dtype), dev, args.batch, args.seq, None, 0)
    else:
        built = model_zoo.build(model_zoo.zoo_config(args.model, "base"), f"--model {args.model}",
                                getattr(torch, args.dtype), dev, batch=args.batch, seq=args.seq, zoo_name=args.model)
    model, inputs = built.model, built.inputs
    if args.patch:
        import xkernels

        xkernels.patch(model)
    eager = Runner(model, inputs)

    def plain_forward():
        return model_zoo.output_of(model(**inputs))

    def plain_step():
        loss = loss_of(model(**inputs))
        loss.backward()
        return loss.detach()

    if args.which == "forward":
        model.eval()
        warm, bodies = eager.forward, {"graph": lambda: captured_forward(model, inputs), "plain graph": plain_forward}
    else:
        model.train()
        warm, bodies = eager.train_step, {"graph": lambda: captured_step(model, inputs), "plain graph": plain_step}
    variants = {"eager": warm}
    for name, body in bodies.items():
        if name == "plain graph" and not args.plain:
            continue
        with torch.no_grad() if args.which == "forward" else torch.enable_grad():
            graph, _ = _capture(warm, body, before=lambda: model.zero_grad(set_to_none=True))
        variants[name] = graph.replay
    for name, call in variants.items():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        kernels: dict[str, list[float]] = collections.defaultdict(list)
        for e in prof.events():
            if e.device_type.name == "CUDA":
                kernels[e.name].append(e.device_time_total / 1e3)
        total = sum(sum(v) for v in kernels.values())
        count = sum(len(v) for v in kernels.values())
        label = f"{args.model}{' patched' if args.patch else ''} {args.which} {name}"
        print(f"== {label}: {total:.3f} ms of device time in {count} kernels")
        ranked = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))
        for k, v in ranked[:args.top]:
            print(f"  {sum(v):8.3f} ms {len(v):4d}x  {k[:110]}")
        attention = [(k, v) for k, v in ranked if any(w in k.lower() for w in ("attention", "fmha", "flash", "softmax"))]
        print("  attention: " + ("; ".join(f"{k[:80]} {len(v)}x {sum(v):.3f} ms" for k, v in attention) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
