"""Does training's linear + activation gain from one kernel that writes the output and the
pre-activation (``xkernels/ops/matmul/pre_activation.py``)?

Question: in training, gelu needs its pre-activation h in the backward, so xkernels ran
``linear(x, W, b)`` (cuBLAS speed) followed by PyTorch's gelu, which reads h back and writes
gelu(h): torch's own cost. The inference kernel with the GELU in its epilogue runs 1.30-1.32x
torch's F.linear + F.gelu at BERT's and ViT's FFN shapes (H100). With one more TMA store of each
tile (h) it should still beat the split form wherever the fused kernel's margin covers one more
write of the result (``pre_activation.pays``).

Per shape, forward rows (each checked against float64 on sampled rows first): torch's
``F.linear`` + activation keeping h; xkernels' split form as it ran before (``linear`` without
activation, then PyTorch's activation); the pre-activation kernel (its call's own plan, whatever
the gate says); the inference kernel (no h) for reference. Then forward + backward of one layer
as autograd runs it: torch, and xkernels with and without the fused training forward. Timing:
``triton.testing.do_bench`` medians (L2 flushed before each call), ``--rounds`` interleaved rounds
in alternating order; rows give the median of round medians and their range. Output: a table and
``--json``.

    python tools/probes/pre_activation_probe.py --json pre.json          # the GPU run (~1 min, H100)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from xkernels import dispatch
from xkernels.ops import linear
from xkernels.ops.matmul import pre_activation
from xkernels.ops.matmul.vendor import activate

SHAPES = ["4096:768:3072:gelu:bf16", "8192:768:3072:gelu:bf16", "12608:768:3072:gelu:bf16",
          "8192:768:3072:gelu_tanh:bf16", "8192:768:3072:gelu:fp16", "2048:768:3072:gelu:bf16",
          "8192:1024:4096:gelu:bf16"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(M, K, N, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, device=device, generator=g).to(dtype)
    w = (torch.randn(N, K, device=device, generator=g) / K**0.5).to(dtype)
    b = (0.5 * torch.randn(N, device=device, generator=g)).to(dtype)
    return x, w, b


def _err(got, ref_rows, rows):
    return ((got[rows].double() - ref_rows).abs().max() / ref_rows.abs().max()).item()


def _timed(fns, rounds, device):
    from triton.testing import do_bench

    per = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names if r % 2 == 0 else reversed(names):
            per[k].append(do_bench(fns[k], warmup=10, rep=60, return_mode="median") * 1e3)
    return {k: (statistics.median(v), min(v), max(v)) for k, v in per.items()}


def run_shape(spec, rounds, device):
    M, K, N, act, dt = spec.split(":")
    M, K, N, dtype = int(M), int(K), int(N), DTYPES[dt]
    x, w, b = _inputs(M, K, N, dtype, device)
    call = linear.check(x, w, b, act)
    backend, plan = linear._decide(call)
    fused_ok = getattr(plan, "tma", None) is not None and not plan.vendor and plan.split_k == 1
    gate = pre_activation.plan_for(linear, x, w, b, act, 0.01) is not None
    row = {"shape": spec, "route": getattr(plan, "variant", str(plan)), "gate": gate,
           "rule_worst_ratio": getattr(plan, "selection", None) and plan.selection.record.get("worst_ratio"),
           "rho": pre_activation.result_write_fraction(backend, x.device, K, x.element_size())}
    rows = torch.cat([torch.arange(128), torch.arange(M - 128, M), torch.randint(0, M, (512,))]).unique().to(device)
    ref_h = x[rows].double() @ w.double().T + b.double()
    ref_y = activate(ref_h, act, 0.01)
    fns = {"torch F.linear + act": lambda: activate(F.linear(x, w, b), act, 0.01)}
    with torch.no_grad():
        fns["xkernels split (linear, torch act)"] = lambda: activate(linear(x, w, b), act, 0.01)
        if fused_ok:
            pre = pre_activation.PreActivationPlan(plan, backend, 0.01)
            y, h = pre(x, w, b, into=(torch.full((M, N), float("nan"), dtype=dtype, device=device),
                                             torch.full((M, N), float("nan"), dtype=dtype, device=device)))
            row["err_y"], row["err_h"] = _err(y, ref_y, rows), _err(h, ref_h, rows)
            row["finite"] = bool(torch.isfinite(y).all() and torch.isfinite(h).all())
            fns["pre-activation kernel (y, h)"] = lambda: pre(x, w, b)
        fns["inference kernel (y only)"] = lambda: linear(x, w, b, act)
        fwd = _timed(fns, rounds, device)
    # forward + backward of one layer through autograd
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    gy = torch.randn(M, N, device=device).to(dtype)

    def step(fn):
        def run():
            for t in (xg, wg, bg):
                t.grad = None
            fn(xg, wg, bg).backward(gy)
        return run

    real = pre_activation.plan_for
    no_pre = lambda *a, **k: None  # noqa: E731
    bwd_fns = {"torch fwd+bwd": step(lambda x, w, b: activate(F.linear(x, w, b), act, 0.01)),
               "xkernels fwd+bwd, fused training forward": step(lambda x, w, b: linear(x, w, b, act))}

    def split_step():
        pre_activation.plan_for = no_pre
        try:
            step(lambda x, w, b: linear(x, w, b, act))()
        finally:
            pre_activation.plan_for = real
    bwd_fns["xkernels fwd+bwd, split forward"] = split_step
    full = _timed(bwd_fns, rounds, device)
    row["us"] = {k: v for k, v in {**fwd, **full}.items()}
    return row


def model_ab(name, rounds):
    """One patched model's training step under CUDA-graph replay, captured twice: with the fused
    training forward and without it (``plan_for`` answering None while capturing); device time of
    each (``bench --model``'s timer: the device held busy first), rounds interleaved."""
    import xkernels
    from xkernels.cli import bench_models as bm
    from xkernels.harness import model_runs, model_zoo, resolve_target

    target = resolve_target("cuda")
    spec = bm.zoo_spec(name)
    built = model_zoo.build(spec.data, spec.source, torch.bfloat16, target.device, None, None, None, 0, spec.zoo_name,
                            spec.size)
    report = xkernels.patch(built.model)
    real = pre_activation.plan_for
    runners = {}
    try:
        runners["fused training forward"] = model_runs.make_runner("cudagraph", built.model, built.inputs, target)
        pre_activation.plan_for = lambda *a, **k: None
        runners["split forward (linear, torch act)"] = model_runs.make_runner("cudagraph", built.model, built.inputs,
                                                                              target)
    finally:
        pre_activation.plan_for = real
    out = bm.interleaved_device_ms(runners, target, rounds)
    for runner in runners.values():
        runner.release()
    report.undo()
    base = out["split forward (linear, torch act)"][0]
    print(f"\n{name} ({built.tokens} tokens), patched, CUDA graphs, training step device ms:")
    for k, (med, lo, hi) in out.items():
        print(f"  {k:36s} {med:8.3f} ms [{lo:.3f}-{hi:.3f}]  {base / med:.4f}x the split form")
    return {"model": name, "ms": out}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="M:K:N:activation:bf16|fp16,...")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", default="", help="models of bench --model for the CUDA-graph training A/B (e.g. "
                                                 "bert-base,vit); with it, no --shapes unless given too")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    device = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()}, backend {dispatch.select(device).name}, torch {torch.__version__}")
    out = []
    shapes = args.shapes.split(",") if args.shapes and (not args.models or "--shapes" in sys.argv) else []
    for name in filter(None, args.models.split(",")):
        try:
            out.append(model_ab(name, args.rounds))
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end
            out.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
            print(out[-1])
    for spec in shapes:
        try:
            row = run_shape(spec, args.rounds, device)
        except Exception as exc:  # noqa: BLE001 - one shape's failure is a row, not the end
            row = {"shape": spec, "error": f"{type(exc).__name__}: {exc}"[:400]}
        out.append(row)
        print(f"\n{spec}: route {row.get('route')}\n  gate {row.get('gate')} (rule worst_ratio "
              f"{row.get('rule_worst_ratio')}, rho {row.get('rho', 0):.3f}); err y {row.get('err_y')}, "
              f"h {row.get('err_h')}, finite {row.get('finite')}  {row.get('error', '')}")
        us = row.get("us", {})
        base = us.get("torch F.linear + act", (None,))[0]
        base_bwd = us.get("torch fwd+bwd", (None,))[0]
        for k, (med, lo, hi) in us.items():
            ref = base_bwd if "fwd+bwd" in k else base
            print(f"  {k:44s} {med:9.1f} us [{lo:.1f}-{hi:.1f}]  {ref / med:.3f}x torch")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
