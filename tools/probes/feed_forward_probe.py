"""Does training's feed-forward block gain from the activation's derivative in the
down-projection's input-gradient GEMM (``ops/matmul/feed_forward.py``)?

Question: the backward of ``down(act(up(x)))`` writes ``dg = dy @ W_down`` (M x F), reads it
with the pre-activation to write ``dh = dg * act'(h)``, and reads ``dh`` again for the bias
gradient. One kernel reading ``h`` in its epilogue saves a write and two reads of (M, F).

Per shape (each checked against float64 first): the backward piece alone, torch (``mm``,
``gelu_backward``, ``sum``) against the one kernel; then one block's forward + backward through
autograd: torch, xkernels as ``patch`` ran it before (two ``linear`` calls, the up-projection
storing its pre-activation), and the fused block. With ``--models``: the patched model's training
step under CUDA-graph replay with the fused block and without it (``plan_for`` answering None
while capturing). Timing: ``triton.testing.do_bench`` medians, ``--rounds`` interleaved rounds in
alternating order; rows give the median of round medians and their range. Output: a table and
``--json``.

    python tools/probes/feed_forward_probe.py --json ff.json                  # ~1 min on an H100
    python tools/probes/feed_forward_probe.py --models bert-base,vit --json ab.json
    python tools/probes/feed_forward_probe.py --compiled --shapes 8192:768:3072:gelu:bf16    # + Inductor's block
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from xkernels import dispatch
from xkernels.ops import linear, matmul
from xkernels.ops.matmul import feed_forward
from xkernels.ops.matmul.vendor import activate

SHAPES = ["8192:768:3072:gelu:bf16", "12608:768:3072:gelu:bf16", "4096:768:3072:gelu:bf16",
          "8192:1024:4096:gelu:bf16"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
aten = torch.ops.aten


def _timed(fns, rounds):
    from triton.testing import do_bench

    per = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names if r % 2 == 0 else reversed(names):
            per[k].append(do_bench(fns[k], warmup=10, rep=60, return_mode="median") * 1e3)
    return {k: (statistics.median(v), min(v), max(v)) for k, v in per.items()}


def _rel(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def run_shape(spec, rounds, device, compiled=False):
    M, D, Fd, act, dt = spec.split(":")
    M, D, Fd, dtype = int(M), int(D), int(Fd), DTYPES[dt]
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(M, D, device=device, generator=g).to(dtype)
    w1 = (torch.randn(Fd, D, device=device, generator=g) / D**0.5).to(dtype)
    b1 = (0.5 * torch.randn(Fd, device=device, generator=g)).to(dtype)
    w2 = (torch.randn(D, Fd, device=device, generator=g) / Fd**0.5).to(dtype)
    b2 = (0.5 * torch.randn(D, device=device, generator=g)).to(dtype)
    dy = torch.randn(M, D, device=device, generator=g).to(dtype)
    plan = feed_forward.plan_for(linear, x, w1, b1, w2, b2, act, 0.01)
    row = {"shape": spec, "fused": plan is not None,
           "route": plan.pre.plan.variant if plan is not None else str(linear.explain(x, w1, b1, act))}
    if plan is None:
        return row
    h = F.linear(x, w1, b1)
    # correctness: the backward piece and the block's gradients against float64
    dh, db = plan.act_grad(dy, w2, h)
    hd = h.double().requires_grad_()
    (want_dh,) = torch.autograd.grad(activate(hd, act, 0.01), hd, dy.double() @ w2.double())
    row["err_dh"], row["err_db"] = _rel(dh, want_dh), _rel(db, want_dh.sum(0))
    leaves = [t.clone().requires_grad_() for t in (x, w1, b1, w2, b2)]
    ref = [t.double().requires_grad_() for t in (x, w1, b1, w2, b2)]
    y = feed_forward.recorded(linear, matmul, *leaves, act, 0.01)
    want = F.linear(activate(F.linear(ref[0], ref[1], ref[2]), act, 0.01), ref[3], ref[4])
    got_g = torch.autograd.grad(y, leaves, dy)
    want_g = torch.autograd.grad(want, ref, dy.double())
    row["err_y"] = _rel(y.detach(), want.detach())
    row["err_grads"] = [_rel(a, b) for a, b in zip(got_g, want_g)]
    piece = {"torch mm + gelu_backward + sum": lambda: aten.gelu_backward(dy @ w2, h).sum(0),
             "fused dgrad kernel (dh, db)": lambda: plan.act_grad(dy, w2, h)}
    fns = {}

    def step(fn):
        return lambda: torch.autograd.grad(fn(*leaves), leaves, dy)

    fns["torch block fwd+bwd"] = step(lambda x, w1, b1, w2, b2: F.linear(activate(F.linear(x, w1, b1), act, 0.01),
                                                                         w2, b2))
    fns["xkernels two linears fwd+bwd"] = step(lambda x, w1, b1, w2, b2: linear(linear(x, w1, b1, act), w2, b2))
    fns["xkernels fused block fwd+bwd"] = step(lambda *a: feed_forward.recorded(linear, matmul, *a, act, 0.01))
    if compiled:  # what Inductor makes of the same block (its GEMMs cuBLAS's, the pointwise and sums fused)
        block = torch.compile(lambda x, w1, b1, w2, b2: F.linear(activate(F.linear(x, w1, b1), act, 0.01), w2, b2))
        fns["torch.compile block fwd+bwd"] = step(block)
    row["us"] = {**_timed(piece, rounds), **_timed(fns, rounds)}
    return row


def model_ab(name, rounds, batch=None, seq=None):
    """The patched model's training step under CUDA-graph replay with and without the fused block."""
    import xkernels
    from xkernels.cli import bench_models as bm
    from xkernels.harness import model_runs, model_zoo, resolve_target

    target = resolve_target("cuda")
    if name.endswith(".json"):  # a transformers config.json, as bench --model-config takes it
        spec = bm.file_spec(name)
        built = model_zoo.build(spec.data, spec.source, torch.bfloat16, target.device, batch, seq, None, 0)
    else:
        spec = bm.zoo_spec(name)
        built = model_zoo.build(spec.data, spec.source, torch.bfloat16, target.device, None, None, None, 0,
                                spec.zoo_name, spec.size)
    report = xkernels.patch(built.model)
    print(report.counts())
    real = feed_forward.plan_for
    runners = {}
    try:
        runners["fused block"] = model_runs.make_runner("cudagraph", built.model, built.inputs, target)
        feed_forward.plan_for = lambda *a, **k: None
        runners["two linears"] = model_runs.make_runner("cudagraph", built.model, built.inputs, target)
    finally:
        feed_forward.plan_for = real
    out = bm.interleaved_device_ms(runners, target, rounds)
    for runner in runners.values():
        runner.release()
    report.undo()
    base = out["two linears"][0]
    print(f"\n{name} ({built.tokens} tokens), patched, CUDA graphs, training step device ms:")
    for k, (med, lo, hi) in out.items():
        print(f"  {k:20s} {med:8.3f} ms [{lo:.3f}-{hi:.3f}]  {base / med:.4f}x two linears")
    return {"model": name, "ms": out}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="M:D:F:activation:bf16|fp16,...")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", default="", help="models of bench --model (or config.json paths, with --batch and "
                                                 "--seq) for the CUDA-graph training A/B")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--compiled", action="store_true", help="also time torch.compile of torch's block (fwd+bwd)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    device = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()}, backend {dispatch.select(device).name}, torch {torch.__version__}")
    out = []
    for name in filter(None, args.models.split(",")):
        try:
            out.append(model_ab(name, args.rounds, args.batch, args.seq))
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end
            out.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
            print(out[-1])
    shapes = args.shapes.split(",") if args.shapes and (not args.models or "--shapes" in sys.argv) else []
    for spec in shapes:
        try:
            row = run_shape(spec, args.rounds, device, args.compiled)
        except Exception as exc:  # noqa: BLE001 - one shape's failure is a row, not the end
            row = {"shape": spec, "error": f"{type(exc).__name__}: {exc}"[:400]}
        out.append(row)
        print(f"\n{spec}: fused {row.get('fused')}, route {row.get('route')}\n  err dh {row.get('err_dh')}, "
              f"db {row.get('err_db')}, y {row.get('err_y')}, grads {row.get('err_grads')}  {row.get('error', '')}")
        us = row.get("us", {})
        for k, (med, lo, hi) in us.items():
            ref = us["torch block fwd+bwd" if "fwd+bwd" in k else "torch mm + gelu_backward + sum"][0]
            print(f"  {k:36s} {med:9.1f} us [{lo:.1f}-{hi:.1f}]  {ref / med:.3f}x torch")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
