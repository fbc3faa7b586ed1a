"""Instructions per call of every documented call form's front door (CPU, launch stubbed, as
``python -m xkernels.bench --host`` on the CPU), counted by callgrind: unlike wall time on a
shared, loaded host, the count does not move with the load (repeat runs agree within ~0.5%).

    python tools/probes/front_door_instructions.py [--python PY] [--calls N]   # runs valgrind
    python tools/probes/front_door_instructions.py --workload N                  # what valgrind runs

Each form is warmed up (its route made), then called N times inside ``functools.reduce``;
callgrind collects only inside ``functools_reduce`` and dumps after each, so part k is form k.
Shapes are small (the count of the front door does not depend on them; torch's own module
column computes, so it is for scale only). Takes a few minutes (torch's import under valgrind).
"""

import argparse
import functools
import glob
import os
import subprocess
import sys
import tempfile


def forms():
    import torch

    import xkernels.nn as xnn
    from xkernels.ops import add, broadcast, linear, matmul

    x, y, X, b = torch.randn(64), torch.randn(64), torch.randn(4, 16), torch.randn(16)
    o, w = torch.empty_like(X), torch.randn(16, 16)
    lin, tlin = xnn.Linear(16, 16), torch.nn.Linear(16, 16)
    return {"add(x, y)": lambda: add(x, y), "add(x, 2.0)": lambda: add(x, 2.0),
            "add(x, y, alpha=2)": lambda: add(x, y, alpha=2), "broadcast(x, b)": lambda: broadcast(X, b),
            "broadcast(x, b, out=o)": lambda: broadcast(X, b, out=o), "matmul(a, b)": lambda: matmul(X, w),
            "linear(x, w)": lambda: linear(X, w), "linear(x, w, b)": lambda: linear(X, w, b),
            'linear(x, w, b, "gelu")': lambda: linear(X, w, b, "gelu"),
            'linear(x, w, bias=b, activation="gelu")': lambda: linear(X, w, bias=b, activation="gelu"),
            "xkernels.nn.Linear module (no_grad)": lambda: lin(X),
            "torch.nn.Linear module (no_grad, computes)": lambda: tlin(X), **block_forms()}


def block_forms():
    """The patched blocks of ``bench --host`` (xkernels/cli/bench_host_blocks.py), small sizes."""
    import copy

    import torch

    import xkernels
    from xkernels.cli.bench_host_blocks import BertSelfOutput, DecoderLayer, LlamaMLP, PassAttention

    bert, layer = BertSelfOutput(32).eval(), DecoderLayer(32, PassAttention(), torch.nn.Identity()).eval()
    mlp = LlamaMLP(32, 48).eval()
    h, r, x = torch.randn(1, 8, 32), torch.randn(1, 8, 32), torch.randn(1, 8, 32)
    out = {}
    for name, m, args in (("BERT output block", bert, (h, r)), ("Llama decoder layer (add+norm steps)", layer, (x,)),
                          ("Llama MLP", mlp, (x,))):
        patched = copy.deepcopy(m)
        xkernels.patch(patched)
        out[f"patched {name}"] = (lambda p, a: lambda: p(*a))(patched, args)
        out[f"torch {name} (computes)"] = (lambda p, a: lambda: p(*a))(m, args)
    return out


def workload(n: int) -> None:
    import torch

    import xkernels
    from xkernels.cli.bench_host import stubbed_launch

    torch.set_num_threads(1)
    table = forms()
    with xkernels.use_backend("interpreter"), stubbed_launch(), torch.no_grad():
        for f in table.values():
            f(), f(), f()
        for f in table.values():
            functools.reduce(lambda acc, _: f(), range(n), None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--workload", type=int)
    args = ap.parse_args()
    if args.workload:
        return workload(args.workload)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--toggle-collect=functools_reduce",
                        "--dump-after=functools_reduce", args.python, os.path.abspath(__file__), "--workload",
                        str(args.calls)], check=True, capture_output=True)
        parts = sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        counts = []
        for p in parts:
            with open(p) as f:
                total = next(int(line.split()[1]) for line in f if line.startswith("summary:"))
            if total > 1000 * args.calls:  # the forms' loops (other reduce calls are tiny)
                counts.append(total / args.calls)
    print(f"instructions per call (callgrind), {args.python}")
    for name, c in zip(forms(), counts):
        print(f"{name:44} {c:9.0f}")


if __name__ == "__main__":
    main()
