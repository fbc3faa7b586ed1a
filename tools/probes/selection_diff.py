"""Which config the matmul/linear selection gives every GEMM of the real-model corpus and of the
held-out models (``unseen_gemms.py``), on a fake H100 (132 SMs, TMA, the cached copy bandwidth
of 3.0 TB/s): CPU only, no device. Run it before and after a change to ``ops/matmul/config.py``
or a table, then ``--diff`` the two JSON files to see which routes the change moves.

    python tools/probes/selection_diff.py --json before.json
    python tools/probes/selection_diff.py --json after.json --diff before.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from unseen_gemms import LAYERS, TOKENS  # noqa: E402

from xkernels.backend import DeviceProperties, Figure  # noqa: E402
from xkernels.backends.cuda import DATASHEET, CudaBackend  # noqa: E402
from xkernels.harness.cases import (  # noqa: E402
    gemm_cases,  # noqa: E402
    linear_cases,
    matmul_cases,
)
from xkernels.ops import linear, matmul  # noqa: E402
from xkernels.ops.matmul import config as mc  # noqa: E402

SMS = 132


class FakeH100(CudaBackend):
    """The cuda backend's selection on an H100, no device needed."""

    def arch(self, device=None) -> str:
        return "sm90"

    def compute_units(self, device=None) -> int:
        return SMS

    def tensor_descriptors(self, device=None) -> bool:
        return True

    def properties(self, device=None) -> DeviceProperties:
        return DeviceProperties(backend="cuda", name="NVIDIA H100 80GB HBM3", arch="sm90", compute_units=SMS,
                                compute_unit_kind="SM", memory_bytes=80 << 30, max_programs_per_launch=2**31 - 1,
                                copy_bandwidth=Figure(3000.0, "GB/s", "measured", "selection_diff"),
                                datasheet=dict(DATASHEET["H100"]))


def gemms(dtype: torch.dtype) -> list[tuple[str, str, int, int, int, str | None, bool]]:
    """(op, label, M, N, K, activation, bias) of the corpus's GEMMs, the seed sizes' 2-D ones and the
    held-out ones."""
    out = []
    for op in ("matmul", "linear"):
        for case in gemm_cases(op, dtype):
            a, b = case.args[0], case.args[1]
            m = 1
            for d in a.shape[:-1]:
                m *= d
            k = a.shape[-1]
            n = b.shape[0] if op == "linear" else b.shape[-1]
            act = next((v for v in case.args[3:4] if isinstance(v, str)), None)
            bias = op == "linear" and len(case.args) > 2 and case.args[2] is not None
            out.append((op, case.layout, m, n, k, act, bias))
    seeds = {"linear": linear_cases, "matmul": matmul_cases}
    for op, build in seeds.items():  # the seed sizes' 2-D cases (square, M=16/64, K=256, odd shape, bias + gelu)
        for case in build(dtype):
            a, b = case.args[0], case.args[1]
            if case.sizes & {"small", "medium", "large"} and len(a.shape) == 2 and len(b.shape) == 2:
                n = b.shape[0] if op == "linear" else b.shape[1]
                act = next((v for v in case.args[3:4] if isinstance(v, str)), None)
                out.append((op, f"seed {case.layout}", a.shape[0], n, a.shape[1], act,
                            op == "linear" and len(case.args) > 2 and case.args[2] is not None))
    for model, layer, k, n, act, bias in LAYERS:
        for m in TOKENS:
            out.append(("linear", f"held-out {model}.{layer}", m, n, k, act, bias))
    return out


def selections(dtype: torch.dtype) -> dict[str, dict]:
    """Each GEMM's plan (``make_plan`` on meta tensors: rules, the wave model and the plan's own
    routes, such as the BLAS epilogue for bias + relu, all as on the device)."""
    backend, res = FakeH100(), {}
    for op, label, m, n, k, act, bias in gemms(dtype):
        def t(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, device="meta")
        if op == "linear":
            call = linear.check(t(m, k), t(n, k), t(n) if bias else None, act)
        else:
            call = matmul.check(t(m, k), t(k, n))
        plan = (linear if op == "linear" else matmul).make_plan(call, backend)
        name = f"{op} {str(dtype)[6:]} {label} M={m} N={n} K={k}" + (f" +{act}" if act else "")
        cfg = plan.config
        res[name] = {"config": "VENDOR" if cfg.get("VENDOR") else mc._label({**mc.MATMUL_DEFAULT, **cfg}),
                     "route": plan.route, "source": str(plan.source).split("/")[-1], "why": plan.why}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--diff", metavar="OLD.json")
    ap.add_argument("--dtype", action="append", default=None)
    args = ap.parse_args()
    res = {}
    for name in args.dtype or ["bfloat16", "float16"]:
        res.update(selections(getattr(torch, name)))
    Path(args.json).write_text(json.dumps(res, indent=1))
    print(f"{len(res)} selections -> {args.json}")
    if args.diff:
        old = json.loads(Path(args.diff).read_text())
        moved = [k for k in res if k in old and old[k]["config"] != res[k]["config"]]
        for k in moved:
            print(f"{k}\n    {old[k]['config']}  ->  {res[k]['config']}\n    why: {res[k]['why'][-200:]}")
        print(f"{len(moved)} of {len(res)} moved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
