"""Every model type transformers knows, shrunk to a tiny config, patched: does ``patch()`` keep
it exact? For each ``model_type`` in transformers' config mapping the probe builds the base model
(``AutoModel.from_config``, or for a composite model's part the class its modeling module declares
for that config: :func:`build`) with every size field it recognises made small, runs one training step
unpatched (float32 and float64) and patched on the chosen backend, and compares the output and every
parameter's gradient as the family suites do (``assert_model_close``).

    python tools/probes/family_sweep.py --backend interpreter --json family-sweep.json
    python tools/probes/family_sweep.py --only llama,whisper --backend interpreter

Each type ends in one of: ``ok`` (exact, with the fusions patch() made), ``mismatch`` /
``patch error`` (xkernels' fault: the family suites should cover it), ``slow`` (the patched step
ran past ``--seconds`` on the interpreter: not checked), or ``no tiny model`` (the
type would not build or run unpatched from the generic config: not xkernels' business, listed
with the reason). Nothing is skipped silently: every type gets a line.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import os
import signal
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

#: config fields made small, by the names configs give them
SIZES = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "embedding_size", "word_embed_proj_dim",
                     "projection_dim"), 32),
    **dict.fromkeys(("intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "hidden_dim",
                     "n_inner", "intermediate_size_mlp", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "ffn_hidden_size"), 48),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "n_layers",
                     "num_decoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "n_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads"), 2),
    **dict.fromkeys(("head_dim", "d_kv", "kv_channels"), 8),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts"), 4),
    "image_size": 32, "patch_size": 8, "max_position_embeddings": 128, "num_experts_per_tok": 2,
}


def shrink(cfg, depth=0):
    from transformers import PretrainedConfig

    from xkernels.harness.model_zoo import random_part
    for name, value in list(vars(cfg).items()):
        if isinstance(value, PretrainedConfig) and depth < 3:
            shrink(value, depth + 1)
        elif isinstance(value, bool):
            continue
        elif name in SIZES and isinstance(value, int) and value > SIZES[name]:
            setattr(cfg, name, SIZES[name])
        elif isinstance(value, float) and random_part(name):
            # every random part off (dropout, stochastic depth, layer drop, SpecAugment's masks)
            setattr(cfg, name, 0.0)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "_experts_implementation"):
        cfg._experts_implementation = "eager"
    return cfg


def build(cfg):
    """``AutoModel.from_config(cfg)``; for a config AutoModel has no base model for (a composite
    model's vision, text or audio part: CLIP's, OWL-ViT's, Qwen2-VL's vision tower, ...) the model
    class its own modeling module declares for exactly that config class, base models first
    (a name ending in ``Model`` without a head), then the rest, by name."""
    import importlib

    import transformers as tf

    try:
        return tf.AutoModel.from_config(cfg)
    except ValueError as e:
        if "Unrecognized configuration class" not in str(e):
            raise
        module = importlib.import_module(type(cfg).__module__.replace(".configuration_", ".modeling_"))
        own = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, tf.PreTrainedModel)
               and getattr(c, "config_class", None) is type(cfg) and not c.__name__.endswith("PreTrainedModel")]
        if not own:
            raise
        own.sort(key=lambda c: (not (c.__name__.endswith("Model") and "For" not in c.__name__), c.__name__))
        return own[0]._from_config(cfg)


def inputs_for(model, cfg, device):
    torch.manual_seed(1)
    params = inspect.signature(model.forward).parameters
    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        vocab = getattr(cfg, "vocab_size", None) or getattr(getattr(cfg, "text_config", None), "vocab_size", 64)
        x = {"input_ids": torch.randint(3, min(vocab, 64), (2, 7), device=device)}
    elif name == "pixel_values":
        vc = getattr(cfg, "vision_config", cfg)
        size = getattr(vc, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        x = {"pixel_values": torch.randn(2, getattr(vc, "num_channels", 3), size, size, device=device)}
    elif name == "input_features" and hasattr(cfg, "num_mel_bins"):
        x = {"input_features": torch.randn(2, cfg.num_mel_bins, 2 * getattr(cfg, "max_source_positions", 64),
                                           device=device)}
    elif name == "input_values":
        x = {"input_values": torch.randn(2, 4000, device=device)}
    else:
        raise LookupError(f"main input {name!r}: no generic input")
    if "decoder_input_ids" in params:
        x["decoder_input_ids"] = torch.randint(3, 32, (2, 5), device=device)
    if "use_cache" in params:  # a training step keeps no cache (hybrid linear-attention caches refuse one)
        x["use_cache"] = False
    return x


def first_float(out):
    for v in (getattr(out, "last_hidden_state", None), getattr(out, "logits", None)):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
    for v in (out.values() if hasattr(out, "values") else out):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
    raise LookupError("no floating output")


def step(model, inputs):
    model.zero_grad(set_to_none=True)
    y = first_float(model(**inputs))
    y.double().square().mean().backward()
    return y.detach(), [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]


class Timeout(Exception):
    pass


def _alarm(*_):
    raise Timeout()


def sweep_one(model_type, device, seconds):
    import transformers as tf

    import xkernels
    from helpers import assert_model_close
    signal.signal(signal.SIGALRM, _alarm)
    try:
        try:
            cfg = shrink(tf.AutoConfig.for_model(model_type))
            torch.manual_seed(0)
            model = build(cfg).to(device).train()
            inputs = inputs_for(model, cfg, device)
            ref64 = copy.deepcopy(model).double()
            # the alarm only from here: raised inside transformers' lazy imports it would leave the
            # modules half-imported for every later type
            signal.alarm(seconds)
            alarm_at = time.perf_counter()
            want, want_grads = step(model, inputs)
            ref, ref_grads = step(ref64, {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                                  for k, v in inputs.items()})
            if not torch.isfinite(want).all() or not torch.isfinite(ref).all():
                raise ValueError("non-finite output unpatched")
            bad = [n for (n, g), (_, r) in zip(want_grads, ref_grads)
                   if not torch.isfinite(g).all() or not torch.isfinite(r).all()]
            if bad:  # (Longformer's and LED's embeddings on cuda): nothing to compare with
                raise ValueError(f"non-finite gradient unpatched: {bad[0]}")
        except Timeout:
            return {"status": "no tiny model", "why": f"over {seconds} s unpatched"}
        except Exception as e:  # noqa: BLE001 - the type does not build or run from a generic config
            first = str(e).splitlines()[0][:200] if str(e) else ""
            return {"status": "no tiny model", "why": f"{type(e).__name__}: {first}"}
        try:
            report = xkernels.patch(model)
            got, got_grads = step(model, inputs)
        except Timeout:
            return {"status": "slow", "why": f"over {seconds} s patched (the interpreter's GEMMs): not checked"}
        except Exception as e:  # noqa: BLE001
            if "Timeout" in repr(e) or time.perf_counter() - alarm_at >= seconds - 0.5:
                # the alarm raised inside a kernel the interpreter runs, or inside code that wraps
                # what it catches in an error of its own
                return {"status": "slow", "why": f"over {seconds} s patched (the interpreter's GEMMs): not checked"}
            return {"status": "patch error", "why": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        counts = {k: v for k, v in report.counts().items() if v}
        try:
            assert_model_close(got, want, ref)
            assert [n for n, _ in got_grads] == [n for n, _ in want_grads], "a parameter lost or gained its gradient"
            for (name, g), (_, w), (_, r) in zip(got_grads, want_grads, ref_grads):
                if w.numel() == 0:  # an empty parameter: only its shape to compare
                    assert g.shape == w.shape, f"gradient of {name}: {tuple(g.shape)} != {tuple(w.shape)}"
                    continue
                try:
                    assert_model_close(g, w, r)
                except AssertionError as e:
                    raise AssertionError(f"gradient of {name}: {e}") from None
        except AssertionError as e:
            return {"status": "mismatch", "why": str(e)[:600], "fusions": counts}
        return {"status": "ok", "fusions": counts, "replaced": len(report.replaced)}
    finally:
        signal.alarm(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="interpreter")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", help="model types, comma-separated (default: all)")
    ap.add_argument("--seconds", type=int, default=40, help="per type and phase")
    ap.add_argument("--json")
    args = ap.parse_args()
    import transformers as tf

    import xkernels
    types = args.only.split(",") if args.only else sorted(tf.models.auto.configuration_auto.CONFIG_MAPPING_NAMES)
    rows = {}
    with xkernels.use_backend(args.backend):
        for t in types:
            t0 = time.perf_counter()
            row = sweep_one(t, torch.device(args.device), args.seconds)
            row["s"] = round(time.perf_counter() - t0, 1)
            rows[t] = row
            print(f"{t}: {row['status']} ({row['s']} s) {row.get('fusions', '')} {row.get('why', '')[:300]}",
                  flush=True)
    tally = {}
    for r in rows.values():
        tally[r["status"]] = tally.get(r["status"], 0) + 1
    print(tally)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"transformers": tf.__version__, "torch": torch.__version__, "backend": args.backend,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
