"""Tiny random Qwen3-Omni checkpoints in the release layout: thinker, talker and Code2Wav.

``write_tiny_qwen3_omni(out_dir)`` writes

    config.json                       transformers-5 spelling (rope_parameters, num_local_experts, dtype),
                                      or ``rope_form="legacy"`` (rope_theta + rope_scaling, num_experts,
                                      torch_dtype); marked "walkserve_random_weights": true
    generation_config.json
    model-000NN-of-000MM.safetensors  + model.safetensors.index.json: the thinker over the first shards
                                      (audio tower, vision, embedding first), then one talker shard and
                                      one Code2Wav shard, as the release orders them
    preprocessor_config.json          Whisper features (128 bins) + image processor (smart resize bounds)
    video_preprocessor_config.json
    tokenizer.json, tokenizer_config.json   a byte-level BPE with the release's 33 added tokens

Tensor names and shapes are those transformers' ``save_pretrained`` writes
for the same config. The weights are perturbed so every part shows up in
the numbers: default initialisations (normal 0.02, zero biases, unit norms,
LayerScale 0.01) make the audio attention and Code2Wav nearly invisible at
float32 tolerance. Here matrices are N(0, 1/fan_in), biases N(0, 0.1),
norms 1 + N(0, 0.1), embeddings N(0, 1), LayerScale and ConvNeXt gamma in
[0.1, 0.5], SnakeBeta log-parameters N(0, 0.3), and Code2Wav's last
convolution scaled so the waveform's std is about 0.3 (not saturated).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import torch

from walkserve.core.errors import ConfigError
from walkserve.models.common.checkpoint import INDEX_FILE
from walkserve.models.qwen3_omni.config import RANDOM_WEIGHTS_KEY, Qwen3OmniConfig
from walkserve.models.qwen3_omni.thinker.weights import thinker_tensor_shapes
from walkserve.models.qwen3_omni.tiny_layout import code2wav_tensor_shapes, talker_tensor_shapes
from walkserve.models.qwen3_omni.tiny_tokenizer import ROLE_IDS, TOKEN_IDS, write_tiny_tokenizer

CODEBOOK = 128  # real 2048
_ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [6, 5, 5], "interleaved": True}
_TOKENS = dict(audio_token_id=TOKEN_IDS["<|audio_pad|>"], image_token_id=TOKEN_IDS["<|image_pad|>"],
               video_token_id=TOKEN_IDS["<|video_pad|>"], audio_start_token_id=TOKEN_IDS["<|audio_start|>"],
               vision_start_token_id=TOKEN_IDS["<|vision_start|>"])
THINKER = dict(
    text_config=dict(model_type="qwen3_omni_moe_text", vocab_size=384, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                     moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, max_position_embeddings=4096,
                     hidden_act="silu", rope_parameters=_ROPE, tie_word_embeddings=False),
    audio_config=dict(model_type="qwen3_omni_moe_audio_encoder", num_mel_bins=128, d_model=32, encoder_layers=2,
                      encoder_attention_heads=4, encoder_ffn_dim=64, downsample_hidden_size=16, output_dim=64,
                      n_window=50, n_window_infer=200, conv_chunksize=500, max_source_positions=1500,
                      activation_function="gelu"),
    vision_config=dict(model_type="qwen3_omni_moe_vision_encoder", depth=4, hidden_size=32, intermediate_size=64,
                       num_heads=4, in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                       out_hidden_size=64, num_position_embeddings=2304, deepstack_visual_indexes=[0, 1, 2],
                       hidden_act="gelu_pytorch_tanh", rope_parameters={"rope_type": "axial", "rope_theta": 10000.0}),
    model_type="qwen3_omni_moe_thinker", user_token_id=ROLE_IDS["user"], position_id_per_seconds=13,
    tie_word_embeddings=False, **_TOKENS)
TALKER = dict(
    text_config=dict(model_type="qwen3_omni_moe_talker_text", vocab_size=CODEBOOK + 1024, hidden_size=32,
                     intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32, moe_intermediate_size=16, num_local_experts=8, num_experts_per_tok=3,
                     norm_topk_prob=True, shared_expert_intermediate_size=48, rms_norm_eps=1e-6,
                     max_position_embeddings=4096, hidden_act="silu", rope_parameters=_ROPE),
    code_predictor_config=dict(model_type="qwen3_omni_moe_talker_code_predictor", vocab_size=CODEBOOK,
                               hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, num_code_groups=16, rms_norm_eps=1e-6,
                               max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    model_type="qwen3_omni_moe_talker", num_code_groups=16, thinker_hidden_size=64, accept_hidden_layer=3,
    codec_eos_token_id=CODEBOOK + 102, codec_pad_id=CODEBOOK + 100, codec_bos_id=CODEBOOK + 101,
    codec_nothink_id=CODEBOOK + 107, codec_think_bos_id=CODEBOOK + 108, codec_think_eos_id=CODEBOOK + 109,
    speaker_id={"chelsie": CODEBOOK + 253, "ethan": CODEBOOK + 254, "aiden": CODEBOOK + 255},
    position_id_per_seconds=13, spatial_merge_size=2, **_TOKENS)
CODE2WAV = dict(codebook_size=CODEBOOK, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                intermediate_size=64, num_hidden_layers=2, sliding_window=8, num_quantizers=16, decoder_dim=64,
                upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], layer_scale_initial_scale=0.01,
                rms_norm_eps=1e-5, max_position_embeddings=8000, hidden_act="silu",
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
PREPROCESSOR = {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128, "sampling_rate": 16000,
                "hop_length": 160, "n_fft": 400, "chunk_length": 30, "padding_value": 0.0, "dither": 0.0,
                "return_attention_mask": True, "image_processor_type": "Qwen2VLImageProcessor",
                "size": {"shortest_edge": 32 * 32, "longest_edge": 256 * 256}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                "do_convert_rgb": True, "resample": 3}
VIDEO_PREPROCESSOR = {"video_processor_type": "Qwen2VLVideoProcessor", "size": {"shortest_edge": 32 * 32,
                      "longest_edge": 128 * 128}, "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                      "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
THINKER_SHARDS = 13  # + one talker and one Code2Wav shard = the release's 15


def tiny_hf_config(speech: bool = True, rope_form: str = "parameters", audio: dict[str, Any] | None = None,
                   vision: dict[str, Any] | None = None, **thinker_text: Any) -> dict[str, Any]:
    """The tiny config.json; ``thinker_text`` overrides fields of thinker_config.text_config, ``audio`` and
    ``vision`` fields of its audio_config and vision_config."""
    thinker = copy.deepcopy(THINKER)
    thinker["text_config"].update(thinker_text)
    thinker["audio_config"].update(audio or {})
    thinker["vision_config"].update(vision or {})
    config: dict[str, Any] = {
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"], "model_type": "qwen3_omni_moe",
        "thinker_config": thinker, "enable_audio_output": speech, "dtype": "float32", RANDOM_WEIGHTS_KEY: True,
        "im_start_token_id": TOKEN_IDS["<|im_start|>"], "im_end_token_id": TOKEN_IDS["<|im_end|>"],
        "tts_pad_token_id": TOKEN_IDS["<tts_pad>"], "tts_bos_token_id": TOKEN_IDS["<tts_text_bos>"],
        "tts_eos_token_id": TOKEN_IDS["<tts_text_eod>"], "system_token_id": ROLE_IDS["system"],
        "user_token_id": ROLE_IDS["user"], "assistant_token_id": ROLE_IDS["assistant"],
    }
    if speech:
        config.update(talker_config=copy.deepcopy(TALKER), code2wav_config=copy.deepcopy(CODE2WAV))
        config["talker_config"]["thinker_hidden_size"] = thinker["text_config"]["hidden_size"]  # its projections' input
    if rope_form == "legacy":
        _to_legacy(config)
    elif rope_form != "parameters":
        raise ConfigError(f"rope_form must be 'parameters' or 'legacy', got {rope_form!r}")
    return config


def _to_legacy(config: dict[str, Any]) -> None:
    """transformers-4 spelling: rope_theta + rope_scaling, talker num_experts, torch_dtype."""
    texts = [config["thinker_config"]["text_config"]]
    if "talker_config" in config:
        talker = config["talker_config"]
        texts += [talker["text_config"], talker["code_predictor_config"]]
        talker["text_config"]["num_experts"] = talker["text_config"].pop("num_local_experts")
        c2w = config["code2wav_config"]
        c2w["rope_theta"] = c2w.pop("rope_parameters")["rope_theta"]
    for text in texts:
        rope = dict(text.pop("rope_parameters"))
        text["rope_theta"] = rope.pop("rope_theta")
        if "mrope_section" in rope:
            text["rope_scaling"] = {**rope, "mrope_interleaved": True}
    config["torch_dtype"] = config.pop("dtype")


def write_tiny_qwen3_omni(out_dir: str | Path, seed: int = 0, speech: bool = True, rope_form: str = "parameters",
                          shards: int | None = None, audio: dict[str, Any] | None = None,
                          vision: dict[str, Any] | None = None, **thinker_text: Any) -> Path:
    """Write the tiny checkpoint; returns ``out_dir``. ``shards`` splits the thinker (default 13); ``audio``,
    ``vision`` and ``thinker_text`` override config fields (``tiny_hf_config``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = tiny_hf_config(speech, rope_form, audio, vision, **thinker_text)
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [TOKEN_IDS["<|im_end|>"], TOKEN_IDS["<|endoftext|>"]], "pad_token_id": TOKEN_IDS["<|endoftext|>"]},
        indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
    (out / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR, indent=2))
    write_tiny_tokenizer(out, hf["thinker_config"]["text_config"]["max_position_embeddings"])
    groups = [_thinker_shards(thinker_tensor_shapes(Qwen3OmniConfig.from_hf(hf)), shards or THINKER_SHARDS)]
    if speech:
        groups.append([talker_tensor_shapes(hf["talker_config"]), code2wav_tensor_shapes(hf["code2wav_config"])])
    _save([g for group in groups for g in group], out, torch.Generator().manual_seed(seed))
    return out


def _thinker_shards(shapes: dict[str, tuple[int, ...]], n: int) -> list[dict[str, tuple[int, ...]]]:
    """Encoders and the embedding first, the final norm and head last, decoder layers in between."""
    def rank(name: str) -> tuple:
        first = name.startswith(("thinker.audio_tower.", "thinker.visual.", "thinker.model.embed_tokens."))
        last = name.startswith(("thinker.model.norm.", "thinker.lm_head."))
        layer = int(name.split(".")[3]) if name.startswith("thinker.model.layers.") else 0
        return (0 if first else 2 if last else 1, layer, name)

    names = sorted(shapes, key=rank)
    n = max(1, min(n, len(names)))
    return [{k: shapes[k] for k in names[i * len(names) // n : (i + 1) * len(names) // n]} for i in range(n)]


def _save(shards: list[dict[str, tuple[int, ...]]], out: Path, gen: torch.Generator) -> None:
    from safetensors.torch import save_file

    weight_map, total = {}, 0
    for i, shapes in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: _random(name, shapes[name], gen) for name in shapes}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


CODE2WAV_OUT_SCALE = 0.015  # -> waveform std about 0.3 before the [-1, 1] clamp (measured with transformers)
_CODE2WAV_OUT = f"code2wav.decoder.{len(CODE2WAV['upsample_rates']) + 2}.conv."
_EMBEDDINGS = ("embed_tokens.weight", "pos_embed.weight", "codec_embedding.weight", "code_embedding.weight")


def _random(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "gamma" or name.endswith("layer_scale.scale"):  # ConvNeXt gamma, Code2Wav LayerScale
        return 0.1 + 0.4 * torch.rand(shape, generator=gen)
    if leaf in ("alpha", "beta"):  # SnakeBeta log-parameters
        return 0.3 * torch.randn(shape, generator=gen)
    if name.endswith(_EMBEDDINGS) or ".codec_embedding." in name:
        return torch.randn(shape, generator=gen)
    if name.startswith(_CODE2WAV_OUT):  # without it the waveform's std is ~20 and 96% of it sits at the clamp
        return _random(name.replace("code2wav.", "output."), shape, gen) * CODE2WAV_OUT_SCALE
    if len(shape) == 1:
        norm = leaf == "weight" and ("norm" in name or ".ln_" in name)
        return (1.0 if norm else 0.0) + 0.1 * torch.randn(shape, generator=gen)
    return torch.randn(shape, generator=gen) / math.sqrt(math.prod(shape[1:]))
