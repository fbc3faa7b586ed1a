"""Whole transformers models for ``python -m xkernels.bench --model`` / ``--model-config``.

    built = build(zoo_config("llama", "base"), source="--model llama", dtype=torch.bfloat16, device=dev)
    built = build(read_config("config.json"), source="config.json", layers=2, dtype=..., device=...)
    out = output_of(built.model(**built.inputs))

The built-in models are data (``model_zoo.json``: BERT-base, GPT-2, a Llama-3-8B-shaped stack,
ViT-B/16, each a transformers config plus a tiny size for CI). Any transformers ``config.json``
builds the same way: its class is ``architectures[0]`` where transformers has that class, else
the Auto class for its ``model_type`` (``AutoModelForCausalLM`` for a ``...ForCausalLM`` /
``...LMHeadModel`` name, ``AutoModel`` otherwise); weights are random (``from_config``), nothing is
downloaded, every dropout probability is set to 0 (so the ways a bench compares compute the same
function) and ``use_cache`` off. Inputs follow the model's main input: ``input_ids`` (and
``decoder_input_ids`` for an encoder-decoder) for text models, ``pixel_values`` of the config's
``num_channels`` x ``image_size`` for vision models, and for speech models log-mel
``input_features`` (``num_mel_bins`` x the encoder's whole window, ``2 * max_source_positions``
frames: Whisper, Speech2Text's takes the same) or one second of 16 kHz ``input_values`` (wav2vec2,
HuBERT, WavLM), with ``--seq`` decoder tokens for an encoder-decoder. A config transformers cannot
build, or a model taking other inputs (text and image together), is a ``ValueError`` saying so.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ZOO_JSON = Path(__file__).with_name("model_zoo.json")
SIZES = ("base", "tiny")
#: the model's main input (``PreTrainedModel.main_input_name``) -> the kind of inputs made for it
INPUT_KINDS = {"input_ids": "text", "pixel_values": "vision", "input_features": "audio", "input_values": "audio"}
#: samples of ``input_values`` (one second at 16 kHz)
AUDIO_SAMPLES = 16000


class ModelsUnavailable(RuntimeError):
    """transformers is not installed (the ``models`` extra)."""


@dataclass
class Built:
    """A model ready to run: ``output_of(model(**inputs))``."""

    model: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    kind: str  # "text", "vision" or "audio"
    batch: int
    seq: int | None  # tokens per sequence (text; an audio encoder-decoder's decoder); None for vision
    tokens: int  # per call: batch x seq (text), batch x patches (vision; images where no patch_size),
    # batch x (encoder positions + decoder tokens) (audio)
    layers: int | None
    description: str
    info: dict[str, Any] = field(default_factory=dict)  # class, model_type, layers, hidden: for the rows


@functools.lru_cache(maxsize=1)
def zoo() -> dict[str, Any]:
    """The parsed ``model_zoo.json``."""
    return json.loads(ZOO_JSON.read_text())


def model_names() -> list[str]:
    """The built-in models, in the order ``--model all`` runs them."""
    return list(zoo()["models"])


def zoo_config(name: str, size: str = "base") -> dict[str, Any]:
    """The config dict of built-in model ``name`` at ``size`` (``base`` or ``tiny``)."""
    if name not in zoo()["models"]:
        raise ValueError(f"--model must be one of {model_names()} or 'all', got {name!r}")
    if size not in SIZES:
        raise ValueError(f"--config must be one of {list(SIZES)}, got {size!r}")
    entry = zoo()["models"][name]
    return {**copy.deepcopy(entry["config"]), **(copy.deepcopy(entry["tiny"]) if size == "tiny" else {})}


def _usable_positions(model: torch.nn.Module, positions: int | None) -> int | None:
    """The tokens a row may hold: ``max_position_embeddings``, less the positions before the first
    one where a position embedding has a padding index (RoBERTa's family counts positions from
    ``pad_token_id + 1``: 514 positions hold 512 tokens)."""
    if not positions:
        return positions
    for name, m in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(m, torch.nn.Embedding) and m.padding_idx is not None:
            return positions - m.padding_idx - 1
    return positions


def default_shape(name: str | None, size: str, kind: str) -> tuple[int, int | None]:
    """(batch, seq) when not given: the zoo entry's, or ``model_config_shape`` for a config file."""
    shape = zoo()["models"][name]["shape"][size] if name else zoo()["model_config_shape"][kind]
    return shape[0], shape[1]


def read_config(path: str | Path) -> dict[str, Any]:
    """A transformers ``config.json`` as a dict (``ValueError`` naming the file if it is not one)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--model-config {path}: cannot read it ({type(e).__name__}: {e.strerror or e})") from None
    except ValueError as e:
        raise ValueError(f"--model-config {path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--model-config {path}: a config.json holds a JSON object, got {type(data).__name__}")
    return data


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise ModelsUnavailable(f"--model needs transformers ({e}): pip install 'xkernels[models]'") from None
    return transformers


def _first_line(exc: BaseException, limit: int = 400) -> str:
    """The exception as one line (a validation error's cause is on its later lines)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def random_part(key: str) -> bool:
    """Whether a config's float ``key`` is the probability of a random part of a training forward:
    dropout, stochastic depth (``drop_path_rate``), LayerDrop (wav2vec2's ``layerdrop``: a dropped
    layer's parameters get no gradient), SpecAugment's masks (``mask_time_prob``) or a router's
    jitter (Mixtral's ``router_jitter_noise``). Each is set to 0 so that every way computes the same
    function."""
    return ("dropout" in key or "pdrop" in key or "drop_path" in key or "layerdrop" in key or "jitter" in key
            or key.startswith("mask_") and key.endswith("_prob"))


def make_config(data: dict[str, Any], source: str, layers: int | None = None) -> Any:
    """The transformers config of ``data`` (a config.json's dict), ``num_hidden_layers`` set to
    ``layers`` where given, every random part off (:func:`random_part`), no KV cache."""
    transformers = _transformers()
    version = transformers.__version__
    data = dict(data)
    model_type = data.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ValueError(f"{source}: the config has no 'model_type' (transformers picks the config class by it)")
    mapping = transformers.CONFIG_MAPPING
    if model_type not in mapping:
        raise ValueError(f"{source}: transformers {version} knows no model_type {model_type!r}")
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ValueError(f"--layers must be a positive integer, got {layers!r}")
        key = getattr(mapping[model_type], "attribute_map", {}).get("num_hidden_layers", "num_hidden_layers")
        if not hasattr(mapping[model_type](), "num_hidden_layers"):  # else the value would be stored, unused
            raise ValueError(f"{source}: --layers sets num_hidden_layers, which {model_type!r} configs do not have")
        if key != "num_hidden_layers":
            data.pop("num_hidden_layers", None)  # the alias would set it again
        data[key] = layers
        if isinstance(data.get("layer_types"), list):  # per-layer attention kinds (Qwen2, Gemma, ...)
            data["layer_types"] = (data["layer_types"] * layers)[:layers]
    try:
        config = transformers.AutoConfig.for_model(model_type, **data)
    except Exception as e:  # transformers' own validation: say which config it refused and why
        raise ValueError(f"{source}: transformers {version} cannot build a {model_type!r} config: "
                         f"{_first_line(e)}") from None
    parts = [k for k in getattr(config, "sub_configs", None) or {} if getattr(config, k, None) is not None]
    if parts:
        raise ValueError(f"{source}: a composite {model_type!r} config ({', '.join(parts)}): bench builds one model "
                         f"of one input kind; write one part (e.g. its {parts[0]}) as a config.json of its own")
    if layers is not None and getattr(config, "num_hidden_layers", layers) != layers:
        raise ValueError(f"{source}: --layers {layers} did not reach the config "
                         f"(num_hidden_layers is {config.num_hidden_layers})")
    for key, value in config.to_dict().items():
        if isinstance(value, float) and random_part(key) and value != 0.0:
            setattr(config, key, 0.0)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    return config


def model_class(config: Any, source: str) -> tuple[Any, str]:
    """(what builds the model from ``config``, how it was chosen)."""
    transformers = _transformers()
    arch = (getattr(config, "architectures", None) or [None])[0]
    if arch:
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type) and hasattr(cls, "_from_config"):
            return cls._from_config, f"architectures[0] {arch}"
        causal = arch.endswith(("ForCausalLM", "LMHeadModel"))
        auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModel
        return auto.from_config, f"{auto.__name__} for model_type {config.model_type!r} ({arch} is not in transformers)"
    return transformers.AutoModel.from_config, f"AutoModel for model_type {config.model_type!r} (no architectures)"


def build(data: dict[str, Any], source: str, dtype: torch.dtype, device: torch.device, batch: int | None = None,
          seq: int | None = None, layers: int | None = None, seed: int = 0, zoo_name: str | None = None,
          size: str = "base", text_seq_only: bool = False) -> Built:
    """The model of config dict ``data`` (random init, dropout 0, on ``device`` in ``dtype``) and
    its inputs. ``zoo_name``/``size`` pick the default shape of a built-in model. ``seq`` for a
    vision model is an error, or with ``text_seq_only`` (one ``--seq`` for several models) not
    applied, which the description says."""
    config = make_config(data, source, layers)
    make, how = model_class(config, source)
    for name, value in (("--batch", batch), ("--seq", seq)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = make(config)
    except Exception as e:
        raise ValueError(f"{source}: transformers cannot build the model ({how}): {_first_line(e)}") from None
    model = model.to(dtype=dtype)
    kind = INPUT_KINDS.get(getattr(model, "main_input_name", None))
    if kind is None:
        raise ValueError(f"{source}: {type(model).__name__} takes {model.main_input_name!r} as its main input; "
                         f"bench makes {sorted(INPUT_KINDS)} only (text, vision and speech models)")
    batch_d, seq_d = default_shape(zoo_name, size, kind)
    batch = batch or batch_d
    if kind == "text":
        positions = _usable_positions(model, getattr(config, "max_position_embeddings", None))
        seq = seq or (min(seq_d, positions) if positions and not zoo_name else seq_d)
        if positions and seq > positions:
            raise ValueError(f"--seq {seq} exceeds the model's {positions} usable positions")
        vocab = getattr(config, "vocab_size", None)
        if not vocab:
            raise ValueError(f"{source}: a text model's config needs vocab_size to make input_ids")
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        inputs = {"input_ids": ids}
        if getattr(config, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = ids
        tokens = batch * seq
    elif kind == "audio":
        if seq is not None and text_seq_only and not getattr(config, "is_encoder_decoder", False):
            how += f"; --seq {seq} applies to text models and decoders only"
            seq = None
        inputs, seq, tokens = _audio_inputs(model, config, source, batch, seq, seq_d, device, dtype)
    else:
        if seq is not None and text_seq_only:
            how += f"; --seq {seq} applies to text models only"
        elif seq is not None:
            raise ValueError(f"--seq does not apply to {type(model).__name__} (a vision model): its sequence comes "
                             f"from image_size and patch_size; set --batch (images)")
        side = getattr(config, "image_size", None)
        channels = getattr(config, "num_channels", None)
        if side is None or channels is None:
            raise ValueError(f"{source}: a vision model's config needs image_size and num_channels for pixel_values")
        h, w = (side, side) if isinstance(side, int) else tuple(side)
        inputs = {"pixel_values": torch.randn(batch, channels, h, w, device=device, dtype=dtype)}
        patch = getattr(config, "patch_size", None)
        ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch) if patch else (h, w)
        tokens = batch * (h // ph) * (w // pw)
    layer_count = getattr(config, "num_hidden_layers", None)
    hidden = getattr(config, "hidden_size", None)
    info = {"class": type(model).__name__, "model_type": config.model_type, "layers": layer_count, "hidden": hidden}
    description = (f"{type(model).__name__} ({how}; {layer_count} layers, hidden {hidden}, attention "
                   f"{getattr(config, '_attn_implementation', None) or 'default'})")
    return Built(model, inputs, kind, batch, seq if kind != "vision" else None, tokens, layer_count, description, info)


def _audio_inputs(model: torch.nn.Module, config: Any, source: str, batch: int, seq: int | None, seq_d: int | None,
                  device: torch.device, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], int | None, int]:
    """A speech model's inputs (module doc), its decoder's tokens per sequence and the tokens per call."""
    seq2seq = getattr(config, "is_encoder_decoder", False)
    if seq is not None and not seq2seq:
        raise ValueError(f"--seq does not apply to {type(model).__name__} (a speech encoder): its frames come from "
                         f"one second of audio; set --batch")
    if model.main_input_name == "input_features":
        mels, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
        if not mels or not positions:
            raise ValueError(f"{source}: a speech model's config needs num_mel_bins and max_source_positions for "
                             f"input_features")
        inputs = {"input_features": torch.randn(batch, mels, 2 * positions, device=device, dtype=dtype)}
        frames = positions
    else:
        inputs = {"input_values": torch.randn(batch, AUDIO_SAMPLES, device=device, dtype=dtype)}
        lengths = getattr(model, "_get_feat_extract_output_lengths", None)
        frames = int(lengths(torch.tensor(AUDIO_SAMPLES))) if lengths else AUDIO_SAMPLES
    if not seq2seq:
        return inputs, None, batch * frames
    limit = getattr(config, "max_target_positions", None) or getattr(config, "max_position_embeddings", None)
    seq = seq or (min(seq_d, limit) if limit else seq_d)
    if limit and seq > limit:
        raise ValueError(f"--seq {seq} exceeds the decoder's {limit} positions")
    vocab = getattr(config, "vocab_size", None)
    if not vocab:
        raise ValueError(f"{source}: a speech encoder-decoder's config needs vocab_size to make decoder_input_ids")
    inputs["decoder_input_ids"] = torch.randint(0, vocab, (batch, seq), device=device)
    return inputs, seq, batch * (frames + seq)


def output_of(out: Any) -> torch.Tensor:
    """The tensor a bench compares and takes its loss from: ``logits`` where the model has a head,
    else ``last_hidden_state``, else the first output."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    first = out[0] if isinstance(out, tuple | list) or hasattr(out, "to_tuple") else out
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"the model returned {type(out).__name__}, with no tensor output to time and compare")
    return first
