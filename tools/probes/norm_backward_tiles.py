"""Device time of the fused norms' backward per tile config, against torch's backward of the same
forward (``x + r`` then ``F.layer_norm``, or Llama's eager RMSNorm), on one GPU.

    python tools/probes/norm_backward_tiles.py [--json OUT.json] [--rows 8192] [--widths 768,1024,4096,5120]

For each norm kind and width: every config of the grid below, forced through
``xkernels.tuning.force`` on ``xkernels.ops.fused.add_norm_bwd.backward`` (d(x), d(residual),
d(weight), d(bias) and the returned sum's gradient, as a training step asks), then torch's
``autograd.grad`` of the same outputs. *Device* time per call: the device is held busy
(``torch.cuda._sleep``) while the calls are queued, each call between two events after a 256 MB
cache flush (cold L2, as in a model where other layers evicted the activations); the median of 30
calls, p20-p80 beside it. Host time per call (the best of 5 loops of 30 queued calls, device
synchronised after each loop) is printed for the table's config and torch's.

Inputs are random normal (never zeros); every config's d(x) and d(w) are compared with torch's
before timing (a config that disagrees is reported and not ranked).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch
import torch.nn.functional as F


def _flush_buffer() -> torch.Tensor:
    return torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")


def device_us(fn, reps: int = 30) -> tuple[float, float, float]:
    """(median, p20, p80) device µs per call of ``fn``: see the module doc. Without CUDA (a dry
    run of this script on the interpreter): host µs of 3 calls."""
    if not torch.cuda.is_available():
        t = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            t.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(t), min(t), max(t)
    cache = _flush_buffer()
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        cache.zero_()
        fn()
    torch.cuda.synchronize()
    host_per = (time.perf_counter() - t0) / 5
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda._sleep(int(2 * reps * host_per * 2e9))  # ~2 GHz: hold the device over the queueing
    for i in range(reps):
        cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
    return statistics.median(t), t[int(0.2 * (reps - 1))], t[int(0.8 * (reps - 1))]


def host_us(fn, reps: int = 30) -> float:
    if not torch.cuda.is_available():
        return device_us(fn)[0]
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
        torch.cuda.synchronize()
    return best * 1e6


def rms_eager(s: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm forward as transformers writes it (fp32 statistics)."""
    h = s.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(s.dtype)


def grid(n: int) -> list[dict[str, int]]:
    block_n = 1 << (n - 1).bit_length()
    if n <= 2048:
        ms, warps = (1, 2, 4, 8, 16), (2, 4, 8)
    else:
        ms, warps = (1, 2), (4, 8, 16)
    return [{"BLOCK_N": block_n, "BLOCK_M": m, "num_warps": w, "WAVES": v}
            for m, w, v in itertools.product(ms, warps, (1, 2, 4, 8))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--widths", default="768,1024,4096,5120")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--dry-run", action="store_true", help="on the cpu interpreter backend, 2 configs per width")
    a = ap.parse_args()
    if a.dry_run:
        import xkernels

        ctx = xkernels.use_backend("interpreter")  # held to the end of main()
        ctx.__enter__()

    from xkernels import dispatch, tuning
    from xkernels.ops import add_layer_norm, add_rms_norm
    from xkernels.ops.fused import add_norm_bwd

    dt = getattr(torch, a.dtype)
    dev = torch.device("cpu" if a.dry_run else "cuda")
    backend = dispatch.select(dev)
    out = {"device": "cpu (dry run)" if a.dry_run else torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    import triton

    out["triton"] = triton.__version__
    torch.manual_seed(0)
    for kind, n in itertools.product(("layer", "rms"), [int(w) for w in a.widths.split(",")]):
        shape = torch.Size((a.rows, n))
        x, r = torch.randn(shape, dtype=dt, device=dev), torch.randn(shape, dtype=dt, device=dev)
        w = (1 + 0.1 * torch.randn(n, device=dev)).to(dt)
        b = (0.1 * torch.randn(n, device=dev)).to(dt) if kind == "layer" else None
        dy, ds = torch.randn(shape, dtype=dt, device=dev), torch.randn(shape, dtype=dt, device=dev)
        # torch: its forward graph, backward timed
        xt, rt = x.clone().requires_grad_(), r.clone().requires_grad_()
        wt = w.clone().requires_grad_()
        bt = None if b is None else b.clone().requires_grad_()
        st = xt + rt
        yt = F.layer_norm(st, (n,), wt, bt, 1e-5) if kind == "layer" else rms_eager(st, wt, 1e-6)
        leaves = [t for t in (xt, rt, wt, bt) if t is not None]

        def torch_bwd():
            return torch.autograd.grad((yt, st), leaves, (dy, ds), retain_graph=True)

        want = torch_bwd()
        # ours: the forward once (statistics), then the backward with each config
        op = add_layer_norm if kind == "layer" else add_rms_norm
        with torch.no_grad():
            call = op.check(x, r, w, b, 1e-5) if kind == "layer" else op.check(x, r, w, 1e-6)
            call.store_sum = True
            y, s, mean, rstd = op.forward_all(call)
        needs = (True, True, True, kind == "layer")

        def ours(cfg):
            def run():
                with tuning.force(cfg):
                    return add_norm_bwd.backward(backend, kind, 0.0, dy, ds, s, None, None,
                                                 mean if kind == "layer" else None, rstd, w,
                                                 dt if kind == "layer" else None, shape, dt, dt, (shape, dt), needs)
            return run

        t_torch = device_us(torch_bwd)
        row = {"kind": kind, "n": n, "rows": a.rows, "dtype": a.dtype, "torch_us": t_torch, "configs": []}
        for cfg in grid(n)[:: 40 if a.dry_run else 1]:
            run = ours(cfg)
            try:
                got = run()
            except Exception as e:  # a config Triton cannot build (shared memory, registers)
                row["configs"].append({**cfg, "error": f"{type(e).__name__}: {str(e)[:120]}"})
                continue
            ok = all(torch.allclose(g.float(), e.float(), rtol=0.05, atol=0.05 * e.float().abs().max().item())
                     for g, e in zip((got[0], got[2]), (want[0], want[2])))
            t = device_us(run)
            row["configs"].append({**cfg, "us": t, "agrees": ok})
        ranked = sorted((c for c in row["configs"] if c.get("agrees")), key=lambda c: c["us"][0])
        # the table's own choice (no forcing), device and host
        table = lambda: add_norm_bwd.backward(backend, kind, 0.0, dy, ds, s, None, None,  # noqa: E731
                                              mean if kind == "layer" else None, rstd, w,
                                              dt if kind == "layer" else None, shape, dt, dt, (shape, dt), needs)
        row["table_us"] = device_us(table)
        row["table_host_us"], row["torch_host_us"] = host_us(table), host_us(torch_bwd)
        row["best"] = ranked[0] if ranked else None
        out["rows"].append(row)
        best = ranked[0] if ranked else {}
        print(f"{kind:5s} n={n:5d} rows={a.rows}: torch {t_torch[0]:7.1f} us | table {row['table_us'][0]:7.1f} us "
              f"({t_torch[0] / row['table_us'][0]:.2f}x) | best {best.get('us', [0])[0]:7.1f} us "
              f"({t_torch[0] / best['us'][0] if best else 0:.2f}x) BLOCK_M={best.get('BLOCK_M')} "
              f"warps={best.get('num_warps')} WAVES={best.get('WAVES')} | host table {row['table_host_us']:.0f} "
              f"torch {row['torch_host_us']:.0f} us", flush=True)
        for c in ranked[:5]:
            print(f"      {c['us'][0]:7.1f} [{c['us'][1]:.1f}-{c['us'][2]:.1f}] BLOCK_M={c['BLOCK_M']} "
                  f"warps={c['num_warps']} WAVES={c['WAVES']}")
        bad = [c for c in row["configs"] if "error" in c or not c.get("agrees", True)]
        for c in bad:
            print(f"      not ranked: {c}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
