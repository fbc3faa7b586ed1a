"""The whole models bench --model builds: the zoo's data, any config.json, --layers, inputs, errors."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import require_transformers
from xkernels.harness import model_zoo

CPU = torch.device("cpu")


def test_zoo_holds_the_four_families_with_published_sizes():
    require_transformers()
    assert model_zoo.model_names() == ["bert-base", "gpt2", "llama", "vit"]
    llama = model_zoo.make_config(model_zoo.zoo_config("llama"), "--model llama")
    assert type(llama).__name__ == "LlamaConfig" and llama.architectures == ["LlamaForCausalLM"]
    assert (llama.hidden_size, llama.intermediate_size, llama.num_attention_heads, llama.num_key_value_heads,
            llama.num_hidden_layers) == (4096, 14336, 32, 8, 2)
    assert llama.vocab_size < 32000 and not llama.tie_word_embeddings and llama.use_cache is False
    vit = model_zoo.make_config(model_zoo.zoo_config("vit"), "--model vit")
    assert (vit.hidden_size, vit.num_hidden_layers, vit.image_size, vit.patch_size) == (768, 12, 224, 16)
    bert = model_zoo.make_config(model_zoo.zoo_config("bert-base"), "--model bert-base")
    assert bert.hidden_dropout_prob == 0.0 and bert.attention_probs_dropout_prob == 0.0  # every way: one function
    assert model_zoo.default_shape("llama", "base", "text") == (1, 2048)
    assert model_zoo.default_shape("vit", "base", "vision") == (64, None)
    with pytest.raises(ValueError, match=r"--model must be one of \['bert-base', 'gpt2', 'llama', 'vit'\]"):
        model_zoo.zoo_config("llama2")


@pytest.mark.parametrize("name", ["bert-base", "gpt2", "llama", "vit"])
def test_tiny_models_build_with_inputs_of_their_kind(name):
    require_transformers()
    built = model_zoo.build(model_zoo.zoo_config(name, "tiny"), f"--model {name}", torch.float32, CPU, batch=2,
                            zoo_name=name, size="tiny")
    assert built.layers == 2 and built.info["hidden"] == 64 and built.batch == 2
    out = model_zoo.output_of(built.model(**built.inputs))
    if name == "vit":  # 32 x 32 images of 8 x 8 patches: 16 patches (+ the class token in the output)
        assert built.kind == "vision" and list(built.inputs) == ["pixel_values"] and built.seq is None
        assert built.inputs["pixel_values"].shape == (2, 3, 32, 32) and built.tokens == 2 * 16
        assert out.shape == (2, 17, 64)
    else:
        assert built.kind == "text" and built.inputs["input_ids"].shape == (2, 16) and built.tokens == 32
        assert out.shape == ((2, 16, 128) if name == "llama" else (2, 16, 64))  # llama: logits of its 128 words
    assert torch.isfinite(out).all()


def test_layers_override_reaches_every_config_spelling():
    require_transformers()
    gpt2 = model_zoo.make_config({"model_type": "gpt2", "n_layer": 12, "n_embd": 64, "n_head": 2}, "gpt2", layers=3)
    assert gpt2.n_layer == 3
    qwen2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 24,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128,
             "layer_types": ["full_attention"] * 24, "attention_dropout": 0.1}
    cfg = model_zoo.make_config(qwen2, "qwen2", layers=2)
    assert cfg.num_hidden_layers == 2 and cfg.layer_types == ["full_attention"] * 2 and cfg.attention_dropout == 0.0
    built = model_zoo.build(qwen2, "qwen2", torch.float32, CPU, batch=1, seq=5, layers=2)
    assert type(built.model).__name__ == "Qwen2ForCausalLM" and len(built.model.model.layers) == 2
    with pytest.raises(ValueError, match="--layers must be a positive integer, got 0"):
        model_zoo.make_config(qwen2, "qwen2", layers=0)


def test_config_without_architectures_uses_the_auto_class(tmp_path):
    require_transformers()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1,
                                "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 50,
                                "max_position_embeddings": 40}))
    built = model_zoo.build(model_zoo.read_config(path), str(path), torch.float32, CPU)
    assert type(built.model).__name__ == "BertModel" and "AutoModel for model_type 'bert'" in built.description
    assert built.batch == 1 and built.seq == 40  # 2048 tokens by default, fewer where the model has fewer positions
    odd = {"model_type": "llama", "architectures": ["MyLlamaForCausalLM"], "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 50}
    built = model_zoo.build(odd, "odd", torch.float32, CPU, seq=4)
    assert type(built.model).__name__ == "LlamaForCausalLM"
    assert "AutoModelForCausalLM for model_type 'llama' (MyLlamaForCausalLM is not in transformers)" in built.description


@pytest.mark.parametrize("data, message", [
    ({"hidden_size": 8}, "the config has no 'model_type'"),
    ({"model_type": "no-such-model"}, "knows no model_type 'no-such-model'"),
    ({"model_type": "clip"}, "a composite 'clip' config"),
    ({"model_type": "qwen2", "num_hidden_layers": 2, "layer_types": ["full_attention"] * 3},
     "cannot build a 'qwen2' config: .*layer_types"),
    ({"model_type": "bert", "hidden_size": 30, "num_attention_heads": 4, "num_hidden_layers": 1},
     "transformers cannot build the model"),
])
def test_configs_transformers_cannot_build_are_value_errors(data, message):
    require_transformers()
    with pytest.raises(ValueError, match=message):
        model_zoo.build(data, "cfg.json", torch.float32, CPU, seq=4)


def test_unreadable_config_files(tmp_path):
    with pytest.raises(ValueError, match=r"--model-config .*missing.json: cannot read it \(FileNotFoundError"):
        model_zoo.read_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        model_zoo.read_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="a config.json holds a JSON object, got list"):
        model_zoo.read_config(tmp_path / "list.json")


def test_inputs_follow_the_model_and_the_arguments():
    require_transformers()
    tiny = model_zoo.zoo_config("vit", "tiny")
    with pytest.raises(ValueError, match="--seq does not apply to ViTModel"):
        model_zoo.build(tiny, "vit", torch.float32, CPU, seq=8)
    with pytest.raises(ValueError, match="--seq 65 exceeds the model's 64 usable positions"):
        model_zoo.build(model_zoo.zoo_config("gpt2", "tiny"), "gpt2", torch.float32, CPU, seq=65)
    t5 = {"model_type": "t5", "architectures": ["T5Model"], "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1,
          "num_heads": 4, "vocab_size": 50}
    built = model_zoo.build(t5, "t5", torch.float32, CPU, seq=6, layers=1)  # an encoder-decoder: both inputs
    assert sorted(built.inputs) == ["decoder_input_ids", "input_ids"]
    assert model_zoo.output_of(built.model(**built.inputs)).shape == (1, 6, 32)


def test_speech_models_take_audio_inputs():
    """A speech encoder gets one second of 16 kHz samples (its frames counted from its feature
    extractor); an encoder-decoder log-mel features over its whole window and --seq decoder tokens."""
    require_transformers()
    audio = {"model_type": "wav2vec2", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 64}
    built = model_zoo.build(audio, "wav2vec2", torch.float32, CPU, batch=2)
    assert built.kind == "audio" and list(built.inputs) == ["input_values"] and built.seq is None
    assert built.inputs["input_values"].shape == (2, model_zoo.AUDIO_SAMPLES)
    out = model_zoo.output_of(built.model(**built.inputs))
    assert built.tokens == 2 * out.shape[1] == 2 * 49  # 16000 samples -> 49 frames of wav2vec2's extractor
    with pytest.raises(ValueError, match="--seq does not apply to Wav2Vec2Model"):
        model_zoo.build(audio, "wav2vec2", torch.float32, CPU, seq=8)
    whisper = {"model_type": "whisper", "architectures": ["WhisperModel"], "d_model": 32, "encoder_layers": 1,
               "decoder_layers": 1, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
               "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_mel_bins": 8, "max_source_positions": 16,
               "max_target_positions": 32, "vocab_size": 64, "pad_token_id": 0}
    built = model_zoo.build(whisper, "whisper", torch.float32, CPU, batch=2, seq=5)
    assert sorted(built.inputs) == ["decoder_input_ids", "input_features"] and built.seq == 5
    assert built.inputs["input_features"].shape == (2, 8, 32) and built.tokens == 2 * (16 + 5)
    assert model_zoo.output_of(built.model(**built.inputs)).shape == (2, 5, 32)
    with pytest.raises(ValueError, match="--seq 33 exceeds the decoder's 32 positions"):
        model_zoo.build(whisper, "whisper", torch.float32, CPU, seq=33)
    assert model_zoo.build(whisper, "whisper", torch.float32, CPU).seq == 32  # the default 64, capped


def test_every_random_part_of_a_training_forward_is_off():
    """wav2vec2's defaults drop whole layers (LayerDrop 0.1: their parameters then get no gradient)
    and mask frames (SpecAugment) at random in training; BEiT's drop paths. The ways must compute one
    function, so each such probability is 0 in the built model, and two training forwards agree."""
    require_transformers()
    audio = {"model_type": "wav2vec2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "layerdrop": 0.5, "mask_time_prob": 0.5, "mask_time_length": 2,
             "mask_feature_prob": 0.3, "mask_feature_length": 2, "hidden_dropout": 0.2}
    built = model_zoo.build(audio, "wav2vec2", torch.float32, CPU, batch=2)
    cfg = built.model.config
    assert (cfg.layerdrop, cfg.mask_time_prob, cfg.mask_feature_prob, cfg.hidden_dropout) == (0.0, 0.0, 0.0, 0.0)
    model = built.model.train()
    first = model_zoo.output_of(model(**built.inputs))
    first.pow(2).mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert torch.equal(first, model_zoo.output_of(model(**built.inputs)))
    beit = {"model_type": "beit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "image_size": 16, "patch_size": 8, "drop_path_rate": 0.3}
    assert model_zoo.build(beit, "beit", torch.float32, CPU).model.config.drop_path_rate == 0.0
    assert [k for k in ("mask_time_prob", "mask_time_length", "layerdrop", "drop_path_rate", "attention_dropout",
                        "resid_pdrop", "router_jitter_noise", "layer_norm_eps") if model_zoo.random_part(k)] == [
        "mask_time_prob", "layerdrop", "drop_path_rate", "attention_dropout", "resid_pdrop", "router_jitter_noise"]


def test_text_models_counting_positions_after_the_padding_index_take_fewer_tokens():
    """RoBERTa's positions start at ``pad_token_id + 1``: 66 positions with padding index 1 hold 64
    tokens, the default takes them and a longer ``--seq`` is refused before anything runs."""
    require_transformers()
    roberta = {"model_type": "roberta", "architectures": ["RobertaModel"], "hidden_size": 32, "num_hidden_layers": 1,
               "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 64, "max_position_embeddings": 66,
               "pad_token_id": 1}
    built = model_zoo.build(roberta, "roberta", torch.float32, CPU, batch=1)
    assert built.seq == 64
    built.model(**built.inputs)  # the last position is in range
    with pytest.raises(ValueError, match="--seq 65 exceeds the model's 64 usable positions"):
        model_zoo.build(roberta, "roberta", torch.float32, CPU, seq=65)
