"""The release's sizes without its weights: ``Qwen/Qwen3-Omni-30B-A3B-Instruct``'s config and a checkpoint of
safetensors headers only (every tensor's name, dtype and shape; no data).

What the memory check and the planner read (``memory.stored_bytes``, the configs) is all there, so
``walkserve plan qwen3-omni --shapes released`` plans for the released model on GPUs this machine does not
have. The thinker's tensor shapes come from our modules on the meta device, the talker's and Code2Wav's from
their layouts (``tiny_layout``); 15 shards in the release's order, bf16.
"""

from __future__ import annotations

import copy
import json
import math
import struct
from pathlib import Path
from typing import Any

from walkserve.models.common.safetensors_files import written_once

MODEL_ID = "Qwen/Qwen3-Omni-30B-A3B-Instruct"
_MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20], "interleaved": True}

SPEECH_RELEASE: dict[str, Any] = {
  "enable_audio_output": True, "dtype": "bfloat16",
  "talker_config": {
    "text_config": {"vocab_size": 3072, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 20,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "moe_intermediate_size": 384,
        "num_experts": 128, "num_experts_per_tok": 6, "norm_topk_prob": True, "shared_expert_intermediate_size": 768,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 65536, "rope_parameters": _MROPE},
    "code_predictor_config": {"vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 65536, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    "num_code_groups": 16, "thinker_hidden_size": 2048, "accept_hidden_layer": 24, "codec_eos_token_id": 2150,
    "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_nothink_id": 2155, "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157, "audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656,
    "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303}},
  "code2wav_config": {"codebook_size": 2048, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16,
    "intermediate_size": 3072, "num_hidden_layers": 8, "sliding_window": 72, "num_quantizers": 16, "decoder_dim": 1536,
    "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "rms_norm_eps": 1e-5, "max_position_embeddings": 8000,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
}  # the release's speech config (shared/research/next_models.md 1.5-1.7)


def release_config() -> dict[str, Any]:
    """config.json of the release (the fields our loaders read)."""
    from walkserve.models.qwen3_omni.tiny import tiny_hf_config

    config = tiny_hf_config()
    thinker = config["thinker_config"]
    thinker["text_config"].update(vocab_size=152064, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                                  num_key_value_heads=4, head_dim=128, moe_intermediate_size=768, num_experts=128,
                                  num_experts_per_tok=8, intermediate_size=768, max_position_embeddings=65536,
                                  rope_parameters=_MROPE)
    thinker["audio_config"] = {"num_mel_bins": 128, "d_model": 1280, "encoder_layers": 32, "encoder_attention_heads": 20,
                               "encoder_ffn_dim": 5120, "downsample_hidden_size": 480, "output_dim": 2048, "n_window": 50,
                               "n_window_infer": 800}
    thinker["vision_config"] = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                                "out_hidden_size": 2048, "num_position_embeddings": 2304, "patch_size": 16,
                                "deepstack_visual_indexes": [8, 16, 24]}
    config.update(copy.deepcopy(SPEECH_RELEASE), dtype="bfloat16")
    config.pop("walkserve_random_weights")
    return config


def write_headers(directory: Path, config: dict[str, Any], shards: int = 15) -> None:
    """Header-only safetensors shards (BF16), the thinker first, the talker and Code2Wav in the last two."""
    from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
    from walkserve.models.qwen3_omni.thinker.weights import thinker_tensor_shapes
    from walkserve.models.qwen3_omni.tiny_layout import code2wav_tensor_shapes, talker_tensor_shapes

    shapes = thinker_tensor_shapes(Qwen3OmniConfig.from_hf(config))
    names = sorted(shapes)
    groups = [{n: shapes[n] for n in names[i * len(names) // (shards - 2):(i + 1) * len(names) // (shards - 2)]}
              for i in range(shards - 2)]
    groups += [talker_tensor_shapes(config["talker_config"]), code2wav_tensor_shapes(config["code2wav_config"])]
    weight_map = {}
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        header, offset = {}, 0
        for name, shape in group.items():
            size = math.prod(shape) * 2
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        blob = json.dumps(header).encode()
        (directory / file).write_bytes(struct.pack("<Q", len(blob)) + blob)
        weight_map.update(dict.fromkeys(group, file))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config))


def released_checkpoint(root: Path) -> Path:
    """The release's header-only checkpoint under ``root`` (written once; reused while complete)."""
    return written_once(root, MODEL_ID, lambda tmp: write_headers(tmp, release_config()))
