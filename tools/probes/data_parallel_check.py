"""A patched model under ``nn.DataParallel`` on every visible GPU, against the same model run on
one GPU: the DataParallel forward is, bit for bit, each batch chunk run alone on GPU 0 (the
replicas run the same kernels on their own parameters); its parameters' gradients match the
one-GPU step's within float32 rounding; every GPU launches xkernels' fused kernels (profiler);
then forward wall time of DataParallel over torch's model and the patched one, in interleaved
rounds.

    python tools/probes/data_parallel_check.py --json data-parallel.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

import xkernels

FUSED = ("rotary_kernel", "gate", "add_norm")  # substrings of xkernels' fused kernels' names


def build(tf, dtype):
    cfg = tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg).to("cuda:0", dtype)


def step(model, ids):
    model.zero_grad(set_to_none=True)
    y = model(ids).logits
    y.float().square().mean().backward()
    inner = model.module if isinstance(model, torch.nn.DataParallel) else model
    return y.detach(), {n: p.grad.float() for n, p in inner.named_parameters() if p.grad is not None}


def kernels_per_device(model, ids):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.no_grad():
        model(ids)
        torch.cuda.synchronize()
    out: dict[int, int] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and any(s in e.name.lower() for s in FUSED):
            out[e.device_index] = out.get(e.device_index, 0) + 1
    return out


def wall(models, ids, rounds, calls=20):
    times = {k: [] for k in models}
    with torch.no_grad():
        for _ in range(rounds):
            for k, m in models.items():
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(calls):
                    m(ids)
                for d in range(torch.cuda.device_count()):
                    torch.cuda.synchronize(d)
                times[k].append((time.perf_counter() - t) / calls * 1e3)
    return {k: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)} for k, v in times.items()}


def main() -> None:
    import transformers as tf
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    gpus = torch.cuda.device_count()
    assert gpus >= 2, f"DataParallel needs two GPUs; {gpus} visible"
    result: dict = {"gpus": gpus, "batch": a.batch, "seq": a.seq}
    ids = torch.randint(3, 32000, (a.batch, a.seq), device="cuda:0")

    # float32: outputs bit for bit, gradients against the one-GPU step
    model = build(tf, torch.float32).train()
    report = xkernels.patch(model)
    result["fused"] = len(report.blocks)
    chunks = ids.chunk(gpus)
    alone = torch.cat([step(model, c)[0] for c in chunks])
    _, grads1 = step(model, ids)
    dp = torch.nn.DataParallel(model)
    y, grads = step(dp, ids)
    result["forward_bitwise"] = bool(torch.equal(y, alone))
    result["forward_max_abs_diff"] = (y - alone).abs().max().item()
    worst = max(((g - grads1[n]).abs().max() / grads1[n].abs().max().clamp_min(1e-30)).item() for n, g in grads.items())
    result["grad_max_rel_diff"] = worst
    result["grad_names_equal"] = sorted(grads) == sorted(grads1)
    result["fused_kernels_per_device"] = kernels_per_device(dp, ids)
    print(json.dumps(result, indent=1))
    assert result["forward_bitwise"] and result["grad_names_equal"] and worst < 1e-4, result
    assert len(result["fused_kernels_per_device"]) == gpus, "a GPU launched no fused kernel"

    # bfloat16 inference wall: DataParallel of torch's model and of the patched one
    base = build(tf, torch.bfloat16).eval()
    patched = copy.deepcopy(base)
    xkernels.patch(patched)
    ways = {"torch": torch.nn.DataParallel(base), "patch": torch.nn.DataParallel(patched)}
    with torch.no_grad():
        for m in ways.values():
            m(ids)
    result["wall_bf16_forward"] = w = wall(ways, ids, a.rounds)
    result["patch_over_torch"] = w["torch"]["median_ms"] / w["patch"]["median_ms"]
    print(json.dumps({k: result[k] for k in ("wall_bf16_forward", "patch_over_torch")}, indent=1))
    result.update(torch=torch.__version__, transformers=tf.__version__, device=torch.cuda.get_device_name(0))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
