"""Does ``rotary_embedding`` (q and k rotated in one launch) beat transformers' ``apply_rotary_pos_emb``
(about fourteen PyTorch ops), alone and in a patched model?

Op rows (``--shapes b:s:heads:kv_heads:head_dim:rotary_dim[:form]``, bf16, q / k laid out as a
transformers attention hands them over: projected, viewed, transposed; ``form``: ``halves``
(Llama's, GPT-NeoX's where partial), ``pairs`` (Cohere's: adjacent pairs, cos / sin per column)
or ``glm`` (GLM's: adjacent pairs from the first half of a Llama-style cos / sin), xkernels'
side being what ``patch()`` binds in the attention's globals): the two ways checked
against each other and float64, then device µs (``do_bench``: L2 flushed before each call) of the
forward and of forward + backward, and host µs per forward call with the device held busy, in
interleaved rounds. Model rows (``--models``: a ``bench --model`` name, ``NAME@BATCHxSEQ``, or a
config.json path ``PATH@BATCHxSEQ``): three copies of one model, torch / patch without the
rotary fusion / patch, in eager and CUDA-graph modes, timed in interleaved rounds with ``bench
--model``'s device and host timing plus a wall time per step switching way every step.

    python tools/probes/rotary_probe.py --json rotary.json \
        --models llama,llama@1x16,tools/probes/data/pythia-1.4b-2-layers.json@8x512,\
                 tools/probes/data/glm-4-9b-2-layers.json@1x2048
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch

from xkernels import dispatch
from xkernels.ops import rotary_embedding

SHAPES = ["1:2048:32:8:128:128", "16:512:32:8:128:128", "64:1:32:8:128:128", "8:1024:16:16:128:32",
          "4:1024:32:32:80:40", "1:2048:32:2:128:64:glm", "64:1:32:2:128:64:glm", "1:2048:64:8:128:128:pairs"]
HOLD_CYCLES = 40_000_000


def hf_rotary(form, partial):
    """(transformers' function, what patch() binds in its place) of a form."""
    from xkernels import rotary_fusion as rf

    if form == "halves":
        from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama

        return (neox, rotary_embedding) if partial else (llama, rotary_embedding)
    if form == "pairs":
        from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb as cohere

        return cohere, rf.fused_rotary(cohere, rf.Form(False, interleaved=True))
    from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as glm

    return glm, rf.fused_rotary(glm, rf.Form(True, halved=True, interleaved=True))


def operands(spec, device):
    b, s, h, hk, d, r = (int(v) for v in spec.split(":")[:6])
    form = (spec.split(":")[6:] or ["halves"])[0]
    g = torch.Generator(device=device).manual_seed(0)
    bf = torch.bfloat16
    q = torch.randn(b, s, h * d, device=device, generator=g).to(bf).view(b, s, h, d).transpose(1, 2)
    k = torch.randn(b, s, hk * d, device=device, generator=g).to(bf).view(b, s, hk, d).transpose(1, 2)
    pos = torch.arange(s, device=device, dtype=torch.float32)[None, :, None] + 7
    inv = 1.0 / (10000 ** (torch.arange(0, r, 2, device=device, dtype=torch.float32) / r))
    emb = (pos * inv).repeat_interleave(2, dim=-1) if form == "pairs" else torch.cat((pos * inv, pos * inv), dim=-1)
    return q, k, emb.cos().to(bf), emb.sin().to(bf), form, r < d


def run_shape(spec, rounds, device):
    from triton.testing import do_bench

    q, k, cos, sin, form, partial = operands(spec, device)
    theirs, ours = hf_rotary(form, partial)
    got, want = ours(q, k, cos, sin), theirs(q, k, cos, sin)
    ref = theirs(q.double(), k.double(), cos.double(), sin.double())
    err = {w: max((a.double() - c).abs().max().item() for a, c in zip(out, ref)) for w, out in
           (("xkernels", got), ("torch", want))}
    gq, gk = torch.randn_like(want[0]), torch.randn_like(want[1])
    leaves = [q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()]

    def step(fn):
        def run():
            a, b = fn(*leaves, cos, sin)
            torch.autograd.backward((a, b), (gq, gk))
        return run

    fns = {"forward": {"torch": lambda: theirs(q, k, cos, sin), "xkernels": lambda: ours(q, k, cos, sin)},
           "forward+backward": {"torch": step(theirs), "xkernels": step(ours)}}
    us: dict = {}
    for p, ways in fns.items():
        per = {w: [] for w in ways}
        for i in range(rounds):
            for w in list(ways) if i % 2 == 0 else list(ways)[::-1]:
                per[w].append(do_bench(ways[w], warmup=10, rep=50, return_mode="median") * 1e3)
        us[p] = {w: (statistics.median(v), min(v), max(v)) for w, v in per.items()}
    host = {w: [] for w in fns["forward"]}
    with torch.no_grad():
        for i in range(rounds):
            for w in list(host) if i % 2 == 0 else list(host)[::-1]:
                fn = fns["forward"][w]
                torch.cuda._sleep(HOLD_CYCLES)
                t0 = time.perf_counter()
                for _ in range(200):
                    fn()
                host[w].append((time.perf_counter() - t0) / 200 * 1e6)
                torch.cuda.synchronize()
    return {"shape": spec, "max_abs_err_vs_float64": err, "device_us": us,
            "host_us": {w: (statistics.median(v), min(v)) for w, v in host.items()}}


class NoRotary:
    """Within the block, patch() leaves every attention's rotary embedding as it is."""

    def __enter__(self):
        from xkernels import rotary_fusion

        self.saved = rotary_fusion.fusion_for
        rotary_fusion.fusion_for = lambda module: (False, None)

    def __exit__(self, *exc):
        from xkernels import rotary_fusion

        rotary_fusion.fusion_for = self.saved


def model_ab(name, rounds, modes):
    import xkernels
    from xkernels.cli import bench_models as bm
    from xkernels.harness import model_runs, model_zoo, resolve_target

    target = resolve_target("cuda")
    what, _, size = name.partition("@")
    batch, seq = (int(v) for v in size.split("x")) if size else (None, None)
    spec = bm.file_spec(what) if what.endswith(".json") else bm.zoo_spec(what)
    built = model_zoo.build(spec.data, spec.source, torch.bfloat16, target.device, batch, seq, None, 0,
                            spec.zoo_name, spec.size)
    models = {"torch": built.model, "patch without rotary": copy.deepcopy(built.model),
              "patch": copy.deepcopy(built.model)}
    with NoRotary():
        counts = {"patch without rotary": xkernels.patch(models["patch without rotary"]).counts()}
    counts["patch"] = xkernels.patch(models["patch"]).counts()
    print(f"\n{name} ({built.tokens} tokens): {counts}")
    rows = []
    for mode in modes:
        runners = {w: model_runs.make_runner(mode, m, built.inputs, target) for w, m in models.items()}
        per = {w: {"device": {p: [] for p in bm.PASSES}, "host": {p: [] for p in bm.PASSES},
                   "wall": {p: [] for p in bm.PASSES}} for w in runners}
        for i in range(rounds):
            order = list(runners) if i % 2 == 0 else list(runners)[::-1]
            for w in order:
                t = bm._time(runners[w], target, bm.MODEL_SETTINGS)
                for p in bm.PASSES:
                    per[w]["device"][p].append(t[p][0])
                    per[w]["host"][p].append(t[p][1])
            for p, attr in zip(bm.PASSES, ("forward", "train_step")):
                for _ in range(3):  # wall: one step per way, switching every step
                    for w in order:
                        fn = getattr(runners[w], attr)
                        fn()
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        fn()
                        torch.cuda.synchronize()
                        per[w]["wall"][p].append((time.perf_counter() - t0) * 1e3)
        for r in runners.values():
            r.release()
        base = per["torch"]
        for w, d in per.items():
            for p in bm.PASSES:
                row = {"model": name, "tokens": built.tokens, "mode": mode, "way": w, "pass": p}
                for kind, v in d.items():
                    row[f"{kind}_ms"] = statistics.median(v[p])
                    row[f"{kind}_range"] = (min(v[p]), max(v[p]))
                    row[f"{kind}_speedup"] = statistics.median(t / x for t, x in zip(base[kind][p], v[p]))
                rows.append(row)
                print(f"  {mode:9s} {p:16s} {w:22s} device {row['device_ms']:8.3f} ms ({row['device_speedup']:.3f}x)"
                      f"  wall {row['wall_ms']:8.3f} ms ({row['wall_speedup']:.3f}x)  host {row['host_ms']:8.3f} ms")
        sys.stdout.flush()
    return {"model": name, "fusions": counts, "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="b:s:heads:kv_heads:head_dim:rotary_dim[:form],...")
    p.add_argument("--models", default="", help="bench --model names or config.json paths, @BATCHxSEQ for inputs")
    p.add_argument("--modes", default="eager,cudagraph")
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
        print(f"\n{spec}: max |err| vs float64 {row.get('max_abs_err_vs_float64')}  {row.get('error', '')}")
        for pas, ways in row.get("device_us", {}).items():
            for w, (med, lo, hi) in ways.items():
                print(f"  {pas:16s} {w:9s} {med:8.2f} us [{lo:.2f}-{hi:.2f}]  {ways['torch'][0] / med:.2f}x torch")
        for w, (med, lo) in row.get("host_us", {}).items():
            print(f"  host/call        {w:9s} {med:8.2f} us (min {lo:.2f})")
        sys.stdout.flush()
    for name in filter(None, args.models.split(",")):
        try:
            out.append(model_ab(name, args.rounds, args.modes.split(",")))
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end
            out.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
            print(out[-1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
