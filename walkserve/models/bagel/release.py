"""The release's sizes without its weights: ``ByteDance-Seed/BAGEL-7B-MoT``'s configs and header-only
``ema.safetensors`` / ``ae.safetensors`` (every tensor's name, dtype and shape; no data).

The shapes are our modules' on the meta device, built from the released configs (14B parameters, 7B
active; the ViT cut to 26 layers as the release runs it), so the memory check and ``walkserve plan bagel
--shapes released`` see the released model on GPUs this machine does not have.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from walkserve.models.common.safetensors_files import written_once

MODEL_ID = "ByteDance-Seed/BAGEL-7B-MoT"
RELEASED_LLM = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
                "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
                "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
                "torch_dtype": "bfloat16"}
RELEASED_VIT = {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                "num_hidden_layers": 27, "num_attention_heads": 16, "num_channels": 3, "image_size": 980,
                "patch_size": 14, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}


def _header_only(path: Path, tensors: dict[str, tuple[int, ...]], dtype: str) -> None:
    """A safetensors file holding only its header (the tensors' names and shapes): what the memory check reads."""
    header, offset = {}, 0
    for name, shape in sorted(tensors.items()):
        size = math.prod(shape) * 2
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)


def _shapes() -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(ema tensors, ae tensors) of the release, by checkpoint name."""

    from walkserve.models.bagel.config import BagelConfig, FluxAEConfig
    from walkserve.models.bagel.flux_ae import FluxDecoder, FluxEncoder
    from walkserve.models.bagel.latents import LatentEmbedder
    from walkserve.models.bagel.mot import MoTLM
    from walkserve.models.bagel.tiny import _llm_config
    from walkserve.models.bagel.vit import BagelViT
    from walkserve.models.common.checkpoint import checkpoint_targets, on_meta
    from walkserve.models.siglip.config import SiglipVisionConfig

    vit = SiglipVisionConfig.from_dict({**RELEASED_VIT, "num_hidden_layers": 26})
    config = BagelConfig(llm=_llm_config(RELEASED_LLM), vit=vit, vae=FluxAEConfig(), max_latent_size=64,
                         vit_max_num_patch_per_side=70)

    def shapes(module, prefix):
        params = dict(module.named_parameters())
        return {name: tuple(params[t.param][t.index].shape) for name, t in checkpoint_targets(module, prefix).items()}

    with on_meta():
        ema = shapes(MoTLM(config.llm), "language_model.")
        v = BagelViT(config)
        ema.update(shapes(v.vit_model, "vit_model.vision_model."))
        ema["vit_model.vision_model.embeddings.patch_embedding.weight"] = (1152, 588)  # stored as the Linear
        ema.update(shapes(v.connector, "connector."))
        ema["vit_pos_embed.pos_embed"] = (70 * 70, 3584)
        latent = LatentEmbedder(config)
        for part in ("time_embedder", "vae2llm", "llm2vae"):
            ema.update(shapes(getattr(latent, part), f"{part}."))
        ema["latent_pos_embed.pos_embed"] = (64 * 64, 3584)
        ae = {**shapes(FluxEncoder(config.vae), "encoder."), **shapes(FluxDecoder(config.vae), "decoder.")}
    return ema, ae


def write_release(out: Path) -> None:
    """The release's configs, tokenizer stub and header-only weights in ``out``."""
    ema, ae = _shapes()
    _header_only(out / "ema.safetensors", ema, "BF16")
    _header_only(out / "ae.safetensors", ae, "BF16")
    (out / "llm_config.json").write_text(json.dumps(RELEASED_LLM))
    (out / "vit_config.json").write_text(json.dumps(RELEASED_VIT))
    (out / "config.json").write_text(json.dumps({"latent_patch_size": 2, "max_latent_size": 64,
                                                 "vit_max_num_patch_per_side": 70, "interpolate_pos": False}))
    names = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
    added = [{"id": 151644 + i, "content": n} for i, n in enumerate(names)]
    (out / "tokenizer.json").write_text(json.dumps({"added_tokens": added}))


def released_checkpoint(root: Path) -> Path:
    """The release's header-only checkpoint under ``root`` (written once; reused while complete)."""
    return written_once(root, MODEL_ID, write_release)
