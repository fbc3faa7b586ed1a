import torch, statistics, triton.testing as tt
from xkernels.ops import matmul
torch.manual_seed(0)
for (m, k, n) in [(333, 20480, 7168), (1500, 20480, 7168)]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16); w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    matmul(x, w); print(matmul.explain(x, w))
    xs, ts = [], []
    for r in range(7):
        pair = [("x", lambda: matmul(x, w)), ("t", lambda: torch.matmul(x, w))]
        if r % 2: pair.reverse()
        for tag, f in pair:
            (xs if tag == "x" else ts).append(tt.do_bench(f, warmup=25, rep=100))
    rat = [t / a for a, t in zip(xs, ts)]
    print(f"{m}x{k}@{k}x{n}: xk {statistics.median(xs)*1e3:.1f} us torch {statistics.median(ts)*1e3:.1f} us ratio median {statistics.median(rat):.3f} [{min(rat):.3f}-{max(rat):.3f}]")
