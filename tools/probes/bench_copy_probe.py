"""Why did the whole-model bench's patched BERT forward double (6.2 -> 12.6 ms) once the bench
timed a deep copy of the model in interleaved rounds? Times the forward (the bench's timer) of:
torch on the model as built; patch() applied to a deep copy; patch() applied in place; with and
without an enable() block run first.

    python tools/probes/bench_copy_probe.py
"""

import copy

import torch

import xkernels
from xkernels.cli import bench_models
from xkernels.harness import Target
from xkernels.harness.perf import Settings, time_calls

S = Settings(warmup=3, warmup_s=0.2, min_reps=10, max_reps=30, budget_s=1.0, flush=False)


def fwd_ms(model, ids, target):
    model.eval()
    with torch.no_grad():
        return time_calls(lambda i: model(i).last_hidden_state, [ids], target, S).median_ms


def main():
    target = Target(xkernels.get_backend("cuda"), torch.device("cuda"))
    built = bench_models.build("bert-base", "base", 16, 512, torch.bfloat16, target.device, 0)
    model, ids = built.model, built.ids
    print(f"torch (as built)          {fwd_ms(model, ids, target):.3f} ms")
    twin = copy.deepcopy(model)
    print(f"torch (deep copy)         {fwd_ms(twin, ids, target):.3f} ms")
    xkernels.patch(twin)
    print(f"patch (deep copy)         {fwd_ms(twin, ids, target):.3f} ms")
    print(f"torch (as built) again    {fwd_ms(model, ids, target):.3f} ms")
    with xkernels.enabled():
        print(f"enable (as built)         {fwd_ms(model, ids, target):.3f} ms")
    print(f"patch (deep copy) after   {fwd_ms(twin, ids, target):.3f} ms")
    print(f"torch (as built) after    {fwd_ms(model, ids, target):.3f} ms")
    del twin
    xkernels.patch(model)
    print(f"patch (in place)          {fwd_ms(model, ids, target):.3f} ms")
    with torch.no_grad():
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(5):
            model(ids)
        torch.cuda.synchronize()
        pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
