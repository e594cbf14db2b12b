"""``write_tiny_bagel``: a random-weight BAGEL checkpoint in the released layout, for tests and demos.

Writes ema.safetensors (every tensor under the release's names, the ViT patch
embedding as its Linear [D, P*P*C]), ae.safetensors (FLUX names),
llm_config.json, vit_config.json (one layer more than is used, as released),
config.json, generation_config.json and a tiny byte-level Qwen2-style
tokenizer (tokenizer.json, tokenizer_config.json, vocab.json, merges.txt)
with BAGEL's special tokens. Weights are perturbed: norms 1 + 0.1 N(0, 1),
biases 0.1 N(0, 1), matrices N(0, 1 / fan_in); the position tables are the
fixed sin-cos tables.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from walkserve.core.errors import ConfigError
from walkserve.models.bagel.config import (
    AE_FILE,
    CONFIG_FILE,
    EMA_FILE,
    LLM_CONFIG_FILE,
    VIT_CONFIG_FILE,
    BagelConfig,
    FluxAEConfig,
)
from walkserve.models.bagel.flux_ae import FluxDecoder, FluxEncoder
from walkserve.models.bagel.latents import LatentEmbedder, sincos_table
from walkserve.models.bagel.mot import MoTLM
from walkserve.models.bagel.vit import BagelViT, conv_to_linear_patch_weight
from walkserve.models.bagel.weights import LM_PREFIX, PATCH_KEY, VIT_PREFIX
from walkserve.models.common.checkpoint import checkpoint_targets
from walkserve.models.common.lm_config import RANDOM_WEIGHTS_KEY, LMConfig
from walkserve.models.common.tiny_tokenizer import TinyTokenIds, write_tokenizer
from walkserve.models.siglip.config import SiglipVisionConfig

LLM = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
       "rope_theta": 1000000.0}
VIT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
       "patch_size": 14, "patches_per_side": 8, "layer_norm_eps": 1e-6}
AE = {"ch": 32, "ch_mult": (1, 1, 2, 2), "num_res_blocks": 1, "z_channels": 16}
MAX_LATENT_SIZE = 8
NORMS = (nn.LayerNorm, nn.GroupNorm)


def write_tiny_bagel(out_dir: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Write the checkpoint; ``overrides`` may replace keys of LLM, VIT, AE or ``max_latent_size``."""
    unknown = set(overrides) - set(LLM) - set(VIT) - set(AE) - {"max_latent_size"}
    if unknown:
        raise ConfigError(f"write_tiny_bagel: unknown override(s) {', '.join(sorted(unknown))}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    llm = {**LLM, **{k: v for k, v in overrides.items() if k in LLM}}
    vit = {**VIT, **{k: v for k, v in overrides.items() if k in VIT}}
    ae = FluxAEConfig(**{**AE, **{k: v for k, v in overrides.items() if k in AE}})
    ids = _write_tokenizer(out, llm["vocab_size"], llm["max_position_embeddings"])
    llm_json, vit_json, top = _configs(llm, vit, int(overrides.get("max_latent_size", MAX_LATENT_SIZE)))
    llm_json.update(eos_token_id=ids.eos_token_ids[0], pad_token_id=ids.pad_token_id)
    generation = {"eos_token_id": ids.eos_token_ids[0], "pad_token_id": ids.pad_token_id}
    for name, data in ((LLM_CONFIG_FILE, llm_json), (VIT_CONFIG_FILE, vit_json), (CONFIG_FILE, top),
                       ("generation_config.json", generation)):
        (out / name).write_text(json.dumps(data, indent=2))
    config = BagelConfig(
        llm=_llm_config(llm_json),
        vit=SiglipVisionConfig.from_dict({**vit_json, "num_hidden_layers": vit["num_hidden_layers"]}),
        vae=ae,
        max_latent_size=top["max_latent_size"],
        vit_max_num_patch_per_side=vit["patches_per_side"],
    )
    gen = torch.Generator().manual_seed(seed)
    _save(out / EMA_FILE, _ema_tensors(config, gen))
    _save(out / AE_FILE, {**_random(FluxEncoder(ae), "encoder.", gen), **_random(FluxDecoder(ae), "decoder.", gen)})
    return out


def _llm_config(llm_json: dict[str, Any]) -> LMConfig:
    from dataclasses import replace

    return replace(LMConfig.from_hf(llm_json), qk_norm=True, tie_word_embeddings=False)


def _configs(llm: dict[str, Any], vit: dict[str, Any], max_latent: int) -> tuple[dict, dict, dict]:
    llm_json = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
                "tie_word_embeddings": False, "use_sliding_window": False, "torch_dtype": "float32",
                RANDOM_WEIGHTS_KEY: True, **llm}
    vit_json = {"model_type": "siglip_vision_model", "hidden_size": vit["hidden_size"],
                "intermediate_size": vit["intermediate_size"], "num_hidden_layers": vit["num_hidden_layers"] + 1,
                "num_attention_heads": vit["num_attention_heads"], "num_channels": 3,
                "image_size": vit["patch_size"] * vit["patches_per_side"], "patch_size": vit["patch_size"],
                "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": vit["layer_norm_eps"], "attention_dropout": 0.0}
    top = {"visual_gen": True, "visual_und": True, "latent_patch_size": 2, "max_latent_size": max_latent,
           "vit_max_num_patch_per_side": vit["patches_per_side"], "connector_act": "gelu_pytorch_tanh",
           "interpolate_pos": False, "timestep_shift": 1.0, RANDOM_WEIGHTS_KEY: True}
    return llm_json, vit_json, top


def _write_tokenizer(out: Path, vocab_size: int, max_length: int) -> TinyTokenIds:
    from tokenizers import Tokenizer

    ids = write_tokenizer(out, "bagel", vocab_size, max_length)
    Tokenizer.from_file(str(out / "tokenizer.json")).model.save(str(out))  # vocab.json + merges.txt
    return ids


def _ema_tensors(config: BagelConfig, gen: torch.Generator) -> dict[str, torch.Tensor]:
    tensors = _random(MoTLM(config.llm), LM_PREFIX, gen)
    vit = BagelViT(config)
    tensors.update(_random(vit.vit_model, VIT_PREFIX, gen))
    tensors[PATCH_KEY] = conv_to_linear_patch_weight(tensors[PATCH_KEY])  # stored as the release's Linear
    tensors.update(_random(vit.connector, "connector.", gen))
    tensors["vit_pos_embed.pos_embed"] = sincos_table(config.vit_max_num_patch_per_side, config.hidden_size)
    latent = LatentEmbedder(config)
    for part in ("time_embedder", "vae2llm", "llm2vae"):
        tensors.update(_random(getattr(latent, part), f"{part}.", gen))
    tensors["latent_pos_embed.pos_embed"] = sincos_table(config.max_latent_size, config.hidden_size)
    return tensors


def _random(module: nn.Module, prefix: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Checkpoint name -> perturbed random tensor, in sorted-name order (deterministic for a seed)."""
    params = dict(module.named_parameters())
    norms = {f"{m}.{p}" if m else p for m, mod in module.named_modules() for p, _ in mod.named_parameters(recurse=False)
             if isinstance(mod, NORMS) or type(mod).__name__ == "RMSNorm"}
    out = {}
    for name, target in sorted(checkpoint_targets(module, prefix).items()):
        shape = tuple(params[target.param][target.index].shape)
        noise = torch.randn(shape, generator=gen)
        if target.param in norms:
            value = 1.0 + 0.1 * noise if target.param.endswith("weight") else 0.1 * noise
        elif len(shape) == 1:
            value = 0.1 * noise
        else:
            value = noise / math.sqrt(math.prod(shape[1:]))
        out[name] = value.contiguous()
    return out


def _save(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
