"""Does a patched mixture-of-experts model route its tokens as torch's does, up to rounding?

A top-k router picks experts by ranking its logits; where two logits are closer than a low
precision's rounding, any change in the last bit of the router's input (a fused norm rounds once
where PyTorch's ops round several times) can swap an expert, and that token's output then moves by
O(1). So a bf16 MoE model's patched output can differ from torch's bf16 output by far more than a
dense model's, without either being wrong. This probe tells the two apart: it builds the model of a
``--model-config`` (``bench``'s builder: random weights, every random part off), runs torch's bf16
model, the patched bf16 model and a float32 copy of the same weights on the same tokens, and
reports, per router (a module returning ``(logits, scores, indices)``, as transformers' top-k
routers do), the share of tokens whose chosen experts differ from the float32 model's, for torch
and for patch, with the outputs' max |dev| from float32.

    python tools/probes/routing_flips.py --model-config tools/probes/data/families/mixtral-8x7b.json [--json OUT]
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

import xkernels
from xkernels.harness import model_zoo


def _routers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("Router")]


def _routes(model: torch.nn.Module, inputs: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The model's output and each router's sorted expert choice per token."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in _routers(model):
        def keep(_m, _i, out, name=name):
            seen[name] = out[-1].sort(-1).values
        hooks.append(mod.register_forward_hook(keep))
    try:
        with torch.no_grad():
            out = model_zoo.output_of(model(**inputs)).float()
    finally:
        for h in hooks:
            h.remove()
    return out, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = model_zoo.read_config(args.model_config)
    built = model_zoo.build(data, args.model_config, torch.bfloat16, device, args.batch, args.seq)
    model = built.model.eval()
    if not _routers(model):
        raise SystemExit(f"{args.model_config}: no module named ...Router in {type(model).__name__}")
    reference = copy.deepcopy(model).float()
    want, want_routes = _routes(reference, built.inputs)
    del reference
    got = {}
    got["torch"] = _routes(model, built.inputs)
    report = xkernels.patch(model)
    got["patch"] = _routes(model, built.inputs)
    report.undo()
    rows = {"model": type(model).__name__, "tokens": built.tokens, "device": str(device),
            "torch": torch.__version__, "fusions": report.counts(), "ways": {}}
    for way, (out, routes) in got.items():
        flips = {n: (r != want_routes[n]).any(-1).float().mean().item() for n, r in routes.items()}
        rows["ways"][way] = {"max_abs_dev_from_fp32": (out - want).abs().max().item(), "flipped_share": flips}
        print(f"{way:6} max|dev| from fp32 {(out - want).abs().max().item():.3g}; tokens routed otherwise than fp32: "
              + ", ".join(f"{n} {100 * f:.2f}%" for n, f in flips.items()))
    t, p = got["torch"][1], got["patch"][1]
    between = {n: (t[n] != p[n]).any(-1).float().mean().item() for n in t}
    rows["patch_vs_torch_flipped_share"] = between
    print("patch against torch: tokens routed otherwise: " + ", ".join(f"{n} {100 * f:.2f}%" for n, f in between.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
