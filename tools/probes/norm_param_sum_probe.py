"""Does one ``part_sum_kernel`` launch for the fused add + norm backward's d(w)/d(b) beat aten's
``part.sum(0)`` and casts (``ops/fused/add_norm_bwd.py``)?

Question: the fused backward leaves d(w)/d(b) as fp32 partial sums, one row per program. They
used to be reduced by aten (``part.sum(0)``, then a cast to the parameters' dtype per gradient:
two or three launches of a few µs each, 24 times per BERT-base training step). One Triton kernel
sums and casts in one launch. A profile of BERT-base's CUDA-graph training step at 1 x 128
tokens put the fused blocks at torch's time, the aten reduction being what was left.

Per shape (``rows:n:layer|rms``, bf16, weight and bias in bf16): the d(w)/d(b) of one backward
both ways, checked against each other, then timed alone (``do_bench`` medians of the partials
the backward left). With ``--models``: each model patched, its training step under CUDA-graph
replay with the kernel and with aten's sum (Python and native backwards alike), in interleaved
rounds of ``bench --model``'s device timing. Output: a table and ``--json``.

    python tools/probes/norm_param_sum_probe.py --models bert-base@1x128,bert-base,llama --json sums.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from xkernels import dispatch
from xkernels.ops import add_layer_norm, add_rms_norm
from xkernels.ops.fused import add_norm_bwd

SHAPES = ["128:768:layer", "8192:768:layer", "2048:4096:rms", "8192:1024:layer", "16384:4096:rms"]


def aten_param_grads(self, part, w_dtype, b_dtype, empty):
    """What the backward did before ``part_sum_kernel``: aten's column sum, then the casts."""
    red = part.sum(0)
    need_dw, need_db = self._flags["NEED_DW"], self._flags["NEED_DB"]
    if need_dw and need_db and w_dtype == b_dtype and red.dtype != b_dtype:
        red = red.to(b_dtype)
    gw = red[0].to(w_dtype) if need_dw else None
    gb = red[self.n_part - 1].to(b_dtype) if need_db else None
    return gw, gb


class AtenSums:
    """Within the block, every new backward signature reduces with aten (native ones too)."""

    def __enter__(self):
        self.saved = (add_norm_bwd.BwdPlan.param_grads, add_norm_bwd.HotBackward._native_sum)
        add_norm_bwd.BwdPlan.param_grads = aten_param_grads
        add_norm_bwd.HotBackward._native_sum = lambda *a: None
        forget()

    def __exit__(self, *exc):
        add_norm_bwd.BwdPlan.param_grads, add_norm_bwd.HotBackward._native_sum = self.saved
        forget()


def forget():
    for op in (add_layer_norm, add_rms_norm):
        op._forget()
    add_norm_bwd._plans.clear()


def run_shape(spec, rounds, device):
    from triton.testing import do_bench

    rows, n, kind = spec.split(":")
    rows, n = int(rows), int(n)
    g = torch.Generator(device=device).manual_seed(0)
    bf = torch.bfloat16
    x, r, dy = (torch.randn(rows, n, device=device, generator=g).to(bf) for _ in range(3))
    w = (1 + 0.1 * torch.randn(n, device=device, generator=g)).to(bf)
    b = (0.1 * torch.randn(n, device=device, generator=g)).to(bf) if kind == "layer" else None
    op = add_layer_norm if kind == "layer" else add_rms_norm
    leaves = [t.clone().requires_grad_() for t in (x, r, w)] + ([b.clone().requires_grad_()] if b is not None else [])
    seen = {}
    real = add_norm_bwd.BwdPlan.param_grads

    def spy(self, part, w_dtype, b_dtype, empty):
        seen["plan"], seen["part"], seen["dtypes"] = self, part.clone(), (w_dtype, b_dtype)
        return real(self, part, w_dtype, b_dtype, empty)

    add_norm_bwd.BwdPlan.param_grads = spy
    try:
        forget()
        y, s = op(*leaves) if kind == "layer" else op(*leaves, 1e-6)
        torch.autograd.backward((y,), (dy,))
    finally:
        add_norm_bwd.BwdPlan.param_grads = real
    if "plan" not in seen:
        return {"shape": spec, "error": "the backward did not take the kernel route"}
    plan, part, (wd, bd) = seen["plan"], seen["part"], seen["dtypes"]
    empty = add_norm_bwd.add_norm_plan._empty
    got = plan.param_grads(part, wd, bd, empty)
    want = aten_param_grads(plan, part, wd, bd, empty)
    err = max(((a.float() - c.float()).abs().max() / c.float().abs().max().clamp_min(1e-30)).item()
              for a, c in zip(got, want) if a is not None)
    fns = {"aten sum + casts": lambda: aten_param_grads(plan, part, wd, bd, empty),
           "part_sum_kernel": lambda: plan.param_grads(part, wd, bd, empty)}
    per = {k: [] for k in fns}
    for i in range(rounds):
        for k in list(fns) if i % 2 == 0 else list(fns)[::-1]:
            per[k].append(do_bench(fns[k], warmup=10, rep=40, return_mode="median") * 1e3)
    return {"shape": spec, "programs": plan.programs, "part_bytes": part.numel() * 4, "rel_diff": err,
            "us": {k: (statistics.median(v), min(v), max(v)) for k, v in per.items()}}


def model_ab(name, rounds):
    import xkernels
    from xkernels.cli import bench_models as bm
    from xkernels.harness import model_runs, model_zoo, resolve_target

    target = resolve_target("cuda")
    zoo, _, size = name.partition("@")
    batch, seq = (int(v) for v in size.split("x")) if size else (None, None)
    spec = bm.zoo_spec(zoo)
    built = model_zoo.build(spec.data, spec.source, torch.bfloat16, target.device, batch, seq, None, 0,
                            spec.zoo_name, spec.size)
    report = xkernels.patch(built.model)
    print(report.counts())
    runners = {}
    with AtenSums():
        runners["aten sum + casts"] = model_runs.make_runner("cudagraph", built.model, built.inputs, target)
    runners["part_sum_kernel"] = model_runs.make_runner("cudagraph", built.model, built.inputs, target)
    launches = {k: kernel_counts(r) for k, r in runners.items()}  # the A/B is real: each replay's kernels
    out = bm.interleaved_device_ms(runners, target, rounds)
    for runner in runners.values():
        runner.release()
    report.undo()
    base = out["aten sum + casts"][0]
    print(f"\n{name} ({built.tokens} tokens), patched, CUDA graphs, training step device ms:")
    for k, (med, lo, hi) in out.items():
        print(f"  {k:20s} {med:8.3f} ms [{lo:.3f}-{hi:.3f}]  {base / med:.4f}x aten's sum   "
              f"kernels per replay: {launches[k]}")
    sys.stdout.flush()
    return {"model": name, "ms": out, "kernels": launches}


def kernel_counts(runner):
    """One replay's kernels: all, ``part_sum_kernel``'s, aten reductions'."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.train_step()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if str(e.device_type).endswith("CUDA")]
    return {"all": len(names), "part_sum_kernel": sum("part_sum_kernel" in n for n in names),
            "aten reductions": sum("reduce_kernel" in n for n in names)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="rows:n:layer|rms,...")
    p.add_argument("--models", default="", help="bench --model names, NAME@BATCHxSEQ for other inputs")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    device = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()}, backend {dispatch.select(device).name}, torch {torch.__version__}")
    out = []
    for spec in filter(None, args.shapes.split(",")):
        try:
            row = run_shape(spec, args.rounds, device)
        except Exception as exc:  # noqa: BLE001 - one shape's failure is a row, not the end
            row = {"shape": spec, "error": f"{type(exc).__name__}: {exc}"[:400]}
        out.append(row)
        print(f"\n{spec}: programs {row.get('programs')}, partials {row.get('part_bytes')} B, "
              f"kernel vs aten max rel diff {row.get('rel_diff')}  {row.get('error', '')}")
        us = row.get("us", {})
        for k, (med, lo, hi) in us.items():
            print(f"  {k:20s} {med:8.2f} us [{lo:.2f}-{hi:.2f}]  {us['aten sum + casts'][0] / med:.2f}x aten")
        sys.stdout.flush()
    for name in filter(None, args.models.split(",")):
        try:
            out.append(model_ab(name, args.rounds))
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end
            out.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
            print(out[-1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
