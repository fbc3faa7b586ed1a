"""What the first-use check (docs/selection.md) costs a patched model's first forward and first
training step, against the same with the check off and against torch's own first calls.

    python tools/probes/first_forward.py [--models bert-base,gpt2,llama,vit,CONFIG.json:BATCH:SEQ]
                                         [--dtype bfloat16] [--size base] [--device cuda] [--json PATH]

A model is a zoo name or a transformers config file with its batch and tokens per sequence (e.g.
``tools/probes/data/qwen2-7b-2-layers.json:1:333``: Qwen2-7B's widths, 2 layers, a family and a
tokens count outside the tables' corpus; ``data/bert-medium.json``: BERT at hidden 512, whose
GEMMs no table rule covers, so they meet first-use checks).

Each run is a fresh process (``--child``) with a fresh ``XKERNELS_CACHE_DIR`` (no verdicts on
disk), in the order torch, check off, check on, check off, check on per model. Triton's own cache
is shared, so the first pair may include kernel compiles that the second finds cached: the second
pair's difference is the check's own cost, the first's includes compiling its candidates. A run
builds the zoo model at its bench shape (random init), patches it (but the torch run), then times
with a synchronized wall clock: the first forward (eval, no grad), the first training step
(forward, mean-square loss, backward) and a second forward. It reports the first-use checks run
(``evidence.checks_run``) and how many kernels they chose.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def child(name: str, way: str, dtype: torch.dtype, size: str, device: torch.device) -> dict[str, Any]:
    import xkernels
    from xkernels.harness import model_zoo
    from xkernels.harness.model_runs import eager_mask_decisions, loss_of
    from xkernels.ops.matmul import evidence

    if name.endswith(".json") or ".json:" in name:
        path, batch, seq = (name.split(":") + ["1", "333"])[:3]
        built = model_zoo.build(model_zoo.read_config(path), path, dtype, device, int(batch), int(seq))
    else:
        built = model_zoo.build(model_zoo.zoo_config(name, size), f"--model {name}", dtype, device, zoo_name=name,
                                size=size)
    model, inputs = built.model, built.inputs
    if way != "torch":
        xkernels.patch(model)
    out: dict[str, Any] = {"model": name, "way": way, "tokens": built.tokens}

    def timed(label: str, fn: Any) -> None:
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out[label] = round((time.perf_counter() - t0) * 1e3, 1)

    def forward() -> None:
        model.eval()
        with torch.no_grad(), eager_mask_decisions(inputs):
            model(**inputs)

    def step() -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        with eager_mask_decisions(inputs):
            loss_of(model(**inputs)).backward()

    timed("first_forward_ms", forward)
    checks_forward = evidence.checks_run
    timed("first_step_ms", step)
    timed("second_forward_ms", forward)
    out["checks_forward"], out["checks_total"] = checks_forward, evidence.checks_run
    won = 0
    for f in Path(os.environ["XKERNELS_CACHE_DIR"]).glob("tuning/*/first_use/*.json"):
        won += sum(v["winner"] == "kernel" for v in json.loads(f.read_text())["verdicts"].values())
    out["kernel_won"] = won
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert-base,gpt2,llama,vit")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--size", default="base")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "WAY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], dtype, args.size, device)), flush=True)
        return 0
    rows = []
    print(f"{'model':10.10} {'way':10} {'first fwd ms':>12} {'first step ms':>13} {'2nd fwd ms':>10} "
          f"{'checks fwd/all':>14} {'kernel won':>10}")
    for name in args.models.split(","):
        label = Path(name.split(":")[0]).stem if ".json" in name else name
        for way in ("torch", "check-off", "check-on", "check-off", "check-on"):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "XKERNELS_CACHE_DIR": cache,
                       "XKERNELS_FIRST_USE_CHECK": "1" if way == "check-on" else "0"}
                cmd = [sys.executable, __file__, "--child", name, way, "--dtype", args.dtype, "--size", args.size,
                       "--device", args.device]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                row = {"model": name, "way": way, "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
                print(f"{label[:10]:10} {way:10} ERROR {row['error']}", flush=True)
            else:
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                print(f"{label[:10]:10} {way:10} {row['first_forward_ms']:12.1f} {row['first_step_ms']:13.1f} "
                      f"{row['second_forward_ms']:10.1f} {row['checks_forward']:>6}/{row['checks_total']:<7} "
                      f"{row['kernel_won']:10}", flush=True)
            rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name() if device.type == "cuda"
                                               else str(device), "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
