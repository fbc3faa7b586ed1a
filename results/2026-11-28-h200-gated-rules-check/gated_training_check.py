"""One training call of gated_linear per route on a CUDA device, bf16 and fp16, at the token counts
around the sm90 rules' edges (16/17: pointer -> TMA; 64/65: TMA -> vendor), against float64
PyTorch: y and every gradient's max |error| / max |float64|, and the route explain() names."""

import torch

from xkernels.ops import gated_linear
from xkernels.ops.fused.gated_linear import reference_gated_linear as ref

torch.manual_seed(0)
for dtype in (torch.bfloat16, torch.float16):
    for concat, h, i in ((False, 4096, 14336), (True, 3072, 8192)):
        w = (torch.randn(2 * i, h, device="cuda") / h**0.5).to(dtype)
        ws = (w,) if concat else (w[:i].contiguous(), w[i:].contiguous())
        for m in (1, 16, 17, 64, 65):
            x = torch.randn(m, h, device="cuda").to(dtype)
            dy = torch.randn(m, i, device="cuda").to(dtype)
            mine = [t.clone().requires_grad_() for t in (x, *ws)]
            y = gated_linear(*mine)
            y.backward(dy)
            r = [t.double().requires_grad_() for t in (x, *ws)]
            y64 = ref(*r)
            y64.backward(dy.double())
            errs = [((a.double() - b).abs().max() / b.abs().max()).item() for a, b in
                    [(y, y64)] + [(p.grad, q.grad) for p, q in zip(mine, r)]]
            e = gated_linear.explain(x, *ws)
            print(f"{str(dtype)[6:]} concat={concat} m={m} route={e.route!r} tma={bool(e.config.get('TMA', False))} "
                  f"rel_err y/grads={' '.join(f'{v:.1e}' for v in errs)}", flush=True)
