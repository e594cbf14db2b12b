"""Tiny random pi0 / pi0.5 checkpoints in lerobot's released layout (tests, demos, benchmarks).

The directory holds what lerobot's ``save_pretrained`` writes, plus a tokenizer:

    config.json            "type": "pi0" | "pi05", lerobot's fields, and "walkserve_sizes" (the tiny
                           transformer and vision sizes real files imply by variant name)
    model.safetensors      every tensor under "model." (as lerobot saves), the tied head written as
                           paligemma.lm_head.weight too, and the expert's unused lm_head
    policy_preprocessor.json / policy_postprocessor.json and their normaliser statistics
    tokenizer.model        a tiny SentencePiece BPE model (tiny_tokenizer.py)

Weights are perturbed away from their identity-like inits (norm weights, the
adaRMS ``dense`` that lerobot zero-initialises), so a test whose path skipped
one of them would fail. The same seed writes the same files.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from walkserve.core.errors import ConfigError
from walkserve.models.pi0.config import (
    ACTION_KEY,
    IMAGE_PREFIX,
    RANDOM_WEIGHTS_KEY,
    SIZES_KEY,
    STATE_KEY,
    GemmaSize,
    PolicyConfig,
)
from walkserve.models.pi0.normalizer import POSTPROCESSOR, PREPROCESSOR
from walkserve.models.pi0.policy import EXPERT, TIED_HEAD, Pi0Policy, checkpoint_name
from walkserve.models.pi0.tiny_tokenizer import tiny_spm_model, write_tiny_tokenizer
from walkserve.models.siglip.config import SiglipVisionConfig

CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
TINY_PALIGEMMA = GemmaSize(64, 2, 128, 8, 1, 16)
TINY_EXPERT = GemmaSize(32, 2, 64, 8, 1, 16)
TINY_VISION = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 image_size=28, patch_size=14)
MODES = {"pi0": "MEAN_STD", "pi05": "QUANTILES"}


@dataclass(frozen=True)
class Preset:
    """The sizes of a random checkpoint, and the defaults it writes (``tiny_config``'s keywords)."""

    paligemma: GemmaSize
    expert: GemmaSize
    vision: SiglipVisionConfig
    defaults: dict = field(default_factory=dict)


# ``bench``: the released shapes scaled down (widths / 8, depth 18 -> 6, SigLIP 27 -> 4 layers) with the real
# token counts: 224 px cameras (256 tokens each), horizon 50, 10 flow steps; for ``./dev bench pi``.
PRESETS = {
    "tiny": Preset(TINY_PALIGEMMA, TINY_EXPERT, TINY_VISION),
    "bench": Preset(GemmaSize(256, 6, 2048, 8, 1, 32), GemmaSize(128, 6, 512, 8, 1, 32),
                    SiglipVisionConfig(hidden_size=144, intermediate_size=576, num_hidden_layers=4, num_attention_heads=2,
                                       image_size=224, patch_size=14), {"chunk_size": 50}),
}


def tiny_config(kind: str, chunk_size: int = 10, state_dim: int = 8, action_dim: int = 7,
                cameras: tuple[str, ...] = CAMERAS, tokenizer_max_length: int | None = None,
                preset: str = "tiny") -> dict:
    """A lerobot-style config.json dict for a random policy of ``preset``'s sizes."""
    sizes = _preset(preset)
    res = sizes.vision.image_size
    mode = MODES[kind]
    return {
        "type": kind, "n_obs_steps": 1,
        "input_features": {**{IMAGE_PREFIX + c: {"type": "VISUAL", "shape": [3, res, res]} for c in cameras},
                           STATE_KEY: {"type": "STATE", "shape": [state_dim]}},
        "output_features": {ACTION_KEY: {"type": "ACTION", "shape": [action_dim]}},
        "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m", "dtype": "float32",
        "chunk_size": chunk_size, "n_action_steps": chunk_size, "max_state_dim": 32, "max_action_dim": 32,
        "num_inference_steps": 10, "min_period": 4e-3, "max_period": 4.0, "image_resolution": [res, res],
        "empty_cameras": 0, "tokenizer_max_length": tokenizer_max_length or (48 if kind == "pi05" else 24),
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode},
        SIZES_KEY: {"paligemma": sizes.paligemma.to_dict(), "expert": sizes.expert.to_dict(),
                    "vision": asdict(sizes.vision), "vocab_size": tiny_spm_model().vocab_size},
        RANDOM_WEIGHTS_KEY: True,
    }


def _preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"pi0 has presets {', '.join(PRESETS)}, not {name!r}")
    return PRESETS[name]


def write_tiny_policy(kind: str, out_dir: str | Path, seed: int = 0, preset: str = "tiny", **overrides) -> Path:
    """Write a random ``kind`` ("pi0" | "pi05") checkpoint of ``preset``'s sizes to ``out_dir``; returns the directory."""
    raw = tiny_config(kind, preset=preset, **{**_preset(preset).defaults, **overrides})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    config = PolicyConfig.from_dict(raw)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy = Pi0Policy(config)
    _randomize(policy, gen)
    _write_weights(policy, out / "model.safetensors", gen)
    write_tiny_tokenizer(out)
    _write_stats(out, config, np.random.default_rng(seed))
    return out


def _randomize(policy: Pi0Policy, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if name.endswith("embed_tokens.weight") or "position_embedding" in name:
                p.normal_(0.0, 0.2, generator=gen)
            elif name.endswith("dense.weight"):  # adaRMS: lerobot zero-inits it
                p.normal_(0.0, 0.3 / p.shape[1] ** 0.5, generator=gen)
            elif p.dim() >= 2:
                p.normal_(0.0, 1.0 / p[0].numel() ** 0.5, generator=gen)
            elif ("layer_norm" in name and name.endswith("weight")) or "post_layernorm.weight" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:  # biases, Gemma (1 + w) norm weights
                p.normal_(0.0, 0.1, generator=gen)


def _write_weights(policy: Pi0Policy, path: Path, gen: torch.Generator) -> None:
    from safetensors.torch import save_file

    tensors = {f"model.{checkpoint_name(n)}": p.detach().contiguous() for n, p in _checkpoint_params(policy)}
    embed = policy.lm.embed_tokens.weight.detach()
    tensors[f"model.{TIED_HEAD}"] = embed.clone()  # lerobot writes the tied head as well
    tensors[f"model.{EXPERT}lm_head.weight"] = torch.randn(
        embed.shape[0], policy.config.expert.hidden_size, generator=gen) * 0.02
    save_file(tensors, str(path))


def _checkpoint_params(policy: Pi0Policy):
    """(own name, tensor) per checkpoint tensor: fused projections split back into their parts."""
    from walkserve.models.common.checkpoint import checkpoint_targets

    params = dict(policy.named_parameters())
    for ckpt_name, target in checkpoint_targets(policy).items():
        yield ckpt_name, params[target.param][target.index]


def _write_stats(out: Path, config: PolicyConfig, rng: np.random.Generator) -> None:
    from safetensors.numpy import save_file

    mode = MODES[config.kind]
    stats: dict[str, np.ndarray] = {}
    for key, dim in ((STATE_KEY, config.state_dim), (ACTION_KEY, config.action_dim)):
        lo = rng.uniform(-2.0, -0.5, dim).astype(np.float32)
        hi = rng.uniform(0.5, 2.0, dim).astype(np.float32)
        stats |= {f"{key}.q01": lo, f"{key}.q99": hi, f"{key}.min": lo - 0.1, f"{key}.max": hi + 0.1,
                  f"{key}.mean": ((lo + hi) / 2).astype(np.float32), f"{key}.std": ((hi - lo) / 4).astype(np.float32)}
    norm_map = {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode}
    features = {STATE_KEY: {"type": "STATE", "shape": [config.state_dim]},
                ACTION_KEY: {"type": "ACTION", "shape": [config.action_dim]}}
    for pipeline, registry, feats in ((PREPROCESSOR, "normalizer_processor", features),
                                      (POSTPROCESSOR, "unnormalizer_processor", {ACTION_KEY: features[ACTION_KEY]})):
        name = pipeline.removesuffix(".json")
        state_file = f"{name}_step_0_{registry}.safetensors"
        save_file(stats, str(out / state_file))
        step = {"registry_name": registry, "config": {"eps": 1e-8, "features": feats, "norm_map": norm_map},
                "state_file": state_file}
        (out / pipeline).write_text(json.dumps({"name": name, "steps": [step]}, indent=2))
