"""V-JEPA 2 configurations: the video encoder, the masked predictor and the action-conditioned (AC) predictor.

The encoder and masked predictor read the Hugging Face ``config.json`` of
``facebook/vjepa2-vit{l,h,g}-fpc64-{256,384}`` (``VJEPA2Config`` fields). The
AC predictor exists only as Meta's original ``vjepa2-ac-vitg.pt``;
``walkserve convert vjepa2-ac`` writes our own ``config.json`` for it
(``model_type: "vjepa2-ac"``, documented in ``docs/models/vjepa2.md``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError

CONFIG_FILE = "config.json"
HF_MODEL_TYPE = "vjepa2"
AC_MODEL_TYPE = "vjepa2-ac"
AC_FORMAT = 1  # version of the config.json we define for the AC checkpoint
RANDOM_WEIGHTS_KEY = "walkserve_random_weights"
ACTION_DIM = 7  # Δxyz, Δeuler-xyz, Δgripper (actions) / xyz, euler-xyz, gripper (states)
COND_TOKENS = 2  # action_t and state_t precede each frame's tokens


@dataclass(frozen=True)
class ViTShape:
    """The width, depth and heads of one transformer stack (pre-norm blocks, GELU MLP, LayerNorm)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    layer_norm_eps: float = 1e-6
    qkv_bias: bool = True

    def __post_init__(self) -> None:
        if min(self.hidden_size, self.num_hidden_layers, self.num_attention_heads, self.intermediate_size) < 1:
            raise ConfigError(f"V-JEPA 2: sizes must be positive, got {self}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"V-JEPA 2: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"V-JEPA 2: head_dim {self.head_dim} must be even (RoPE pairs)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class EncoderConfig:
    """The ViT video encoder: tubelet x patch x patch Conv3d patches, 3-D RoPE, no absolute positions."""

    vit: ViTShape
    patch_size: int = 16
    tubelet_size: int = 2
    crop_size: int = 256
    in_chans: int = 3
    frames_per_clip: int = 64

    @property
    def hidden_size(self) -> int:
        return self.vit.hidden_size

    @property
    def grid_size(self) -> int:
        """Patches per side of a ``crop_size`` square frame."""
        return self.crop_size // self.patch_size

    def tokens(self, frames: int, height: int, width: int) -> int:
        """Tokens of a clip of ``frames`` frames of ``height`` x ``width`` pixels."""
        return (frames // self.tubelet_size) * (height // self.patch_size) * (width // self.patch_size)


@dataclass(frozen=True)
class MaskedPredictorConfig:
    """The masked (JEPA) predictor: embeds context tokens, adds mask tokens at target positions, predicts them."""

    vit: ViTShape
    num_mask_tokens: int = 10
    mask_index: int = 1  # which mask token fills every target (transformers and the released code use 1)


@dataclass(frozen=True)
class VJEPA2Config:
    """A V-JEPA 2 checkpoint in the HF layout: encoder + masked predictor."""

    encoder: EncoderConfig
    predictor: MaskedPredictorConfig
    random_weights: bool = False

    @staticmethod
    def from_hf(d: dict[str, Any], source: str = "config.json") -> VJEPA2Config:
        if d.get("model_type", HF_MODEL_TYPE) != HF_MODEL_TYPE:
            raise ConfigError(f"{source}: model_type {d.get('model_type')!r} is not {HF_MODEL_TYPE!r}")
        if d.get("hidden_act", "gelu") != "gelu":
            raise ConfigError(f"{source}: hidden_act {d['hidden_act']!r} is not supported (gelu only)")
        try:
            hidden, pred = int(d.get("hidden_size", 1024)), int(d.get("pred_hidden_size", 384))
            eps, bias = float(d.get("layer_norm_eps", 1e-6)), bool(d.get("qkv_bias", True))
            enc_vit = ViTShape(hidden, int(d.get("num_hidden_layers", 24)), int(d.get("num_attention_heads", 16)),
                               int(hidden * float(d.get("mlp_ratio", 4.0))), eps, bias)
            pred_vit = ViTShape(pred, int(d.get("pred_num_hidden_layers", 12)),
                                int(d.get("pred_num_attention_heads", 12)),
                                int(pred * float(d.get("pred_mlp_ratio", 4.0))), eps, bias)
            patch = d.get("patch_size", 16)
            encoder = EncoderConfig(enc_vit, int(patch[0] if isinstance(patch, list | tuple) else patch),
                                    int(d.get("tubelet_size", 2)), int(d.get("crop_size", 256)),
                                    int(d.get("in_chans", 3)), int(d.get("frames_per_clip", 64)))
            predictor = MaskedPredictorConfig(pred_vit, int(d.get("pred_num_mask_tokens", 10)))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: invalid V-JEPA 2 config ({e})") from None
        return VJEPA2Config(encoder, predictor, random_weights=d.get(RANDOM_WEIGHTS_KEY) is True)

    def to_hf(self) -> dict[str, Any]:
        """The HF ``config.json`` fields (``VJEPA2Config``) for this configuration."""
        e, p = self.encoder, self.predictor
        return {
            "architectures": ["VJEPA2Model"], "model_type": HF_MODEL_TYPE, "patch_size": e.patch_size,
            "crop_size": e.crop_size, "frames_per_clip": e.frames_per_clip, "tubelet_size": e.tubelet_size,
            "in_chans": e.in_chans, "hidden_size": e.vit.hidden_size, "num_hidden_layers": e.vit.num_hidden_layers,
            "num_attention_heads": e.vit.num_attention_heads, "mlp_ratio": e.vit.intermediate_size / e.vit.hidden_size,
            "layer_norm_eps": e.vit.layer_norm_eps, "qkv_bias": e.vit.qkv_bias, "hidden_act": "gelu",
            "drop_path_rate": 0.0, "pred_hidden_size": p.vit.hidden_size,
            "pred_num_hidden_layers": p.vit.num_hidden_layers, "pred_num_attention_heads": p.vit.num_attention_heads,
            "pred_mlp_ratio": p.vit.intermediate_size / p.vit.hidden_size, "pred_num_mask_tokens": p.num_mask_tokens,
            "pred_zero_init_mask_tokens": True,
        }


@dataclass(frozen=True)
class ACPredictorConfig:
    """The action-conditioned predictor (V-JEPA 2-AC), a KV-cache component.

    Per step t it reads ``COND_TOKENS + frame_tokens`` tokens (action_t,
    state_t, the frame's grid_size² encoder tokens), block-causal by step, for
    at most ``max_steps`` steps (the released mask is prebuilt for 32).
    The first four fields below are the KV-engine contract (``num_key_value_heads``,
    ``head_dim`` and ``embed_size``, the width of embedding rows, are properties).
    """

    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    input_size: int = 1408  # the encoder width: frame tokens come in and go out at this width
    grid_size: int = 16  # patches per side of the (square) frame
    max_steps: int = 32
    action_dim: int = ACTION_DIM
    layer_norm_eps: float = 1e-6
    qkv_bias: bool = True

    def __post_init__(self) -> None:
        _ = self.vit  # validates the stack's shape
        if min(self.input_size, self.grid_size, self.max_steps, self.action_dim) < 1:
            raise ConfigError(f"V-JEPA 2-AC: sizes must be positive, got {self}")
        if self.action_dim > self.input_size:
            raise ConfigError(f"V-JEPA 2-AC: action_dim {self.action_dim} exceeds input_size {self.input_size}")

    @property
    def vit(self) -> ViTShape:
        return ViTShape(self.hidden_size, self.num_hidden_layers, self.num_attention_heads, self.intermediate_size,
                        self.layer_norm_eps, self.qkv_bias)

    @property
    def num_key_value_heads(self) -> int:
        return self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embed_size(self) -> int:
        """The width of ``inputs_embeds`` rows (the KV engine checks embeddings against it): the encoder's."""
        return self.input_size

    @property
    def frame_tokens(self) -> int:
        return self.grid_size * self.grid_size

    @property
    def tokens_per_step(self) -> int:
        return COND_TOKENS + self.frame_tokens


@dataclass(frozen=True)
class VJEPA2ACConfig:
    """The config.json of a converted V-JEPA 2-AC checkpoint: the encoder and the AC predictor."""

    encoder: EncoderConfig
    predictor: ACPredictorConfig
    dtype: str = "float32"
    source: str = ""
    random_weights: bool = False

    def __post_init__(self) -> None:
        e, p = self.encoder, self.predictor
        if p.input_size != e.hidden_size:
            raise ConfigError(f"V-JEPA 2-AC: predictor input_size {p.input_size} != encoder width {e.hidden_size}")
        if p.grid_size != e.grid_size:
            raise ConfigError(f"V-JEPA 2-AC: predictor grid {p.grid_size} != encoder crop grid {e.grid_size}")

    def to_dict(self) -> dict[str, Any]:
        encoder = asdict(self.encoder)
        encoder.update(encoder.pop("vit"))
        encoder.pop("frames_per_clip")
        out = {"model_type": AC_MODEL_TYPE, "format": AC_FORMAT, "dtype": self.dtype, "source": self.source,
               "encoder": encoder, "predictor": asdict(self.predictor)}
        if self.random_weights:
            out[RANDOM_WEIGHTS_KEY] = True
        return out

    @staticmethod
    def from_dict(d: dict[str, Any], source: str = "config.json") -> VJEPA2ACConfig:
        if d.get("model_type") != AC_MODEL_TYPE or d.get("format") != AC_FORMAT:
            raise ConfigError(f"{source}: not a {AC_MODEL_TYPE!r} config of format {AC_FORMAT} "
                              f"(model_type {d.get('model_type')!r}, format {d.get('format')!r})")
        try:
            enc = dict(d["encoder"])
            vit = ViTShape(**{k: enc.pop(k) for k in ViTShape.__dataclass_fields__ if k in enc})
            encoder = EncoderConfig(vit, **enc)
            predictor = ACPredictorConfig(**d["predictor"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{source}: invalid {AC_MODEL_TYPE} config ({type(e).__name__}: {e})") from None
        return VJEPA2ACConfig(encoder, predictor, str(d.get("dtype", "float32")), str(d.get("source", "")),
                              d.get(RANDOM_WEIGHTS_KEY) is True)


def read_config(path: str | Path) -> VJEPA2Config | VJEPA2ACConfig:
    """The configuration of a checkpoint directory: HF V-JEPA 2, or our converted V-JEPA 2-AC."""
    file = Path(path) / CONFIG_FILE
    try:
        d = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{file}: cannot read ({e})") from None
    if d.get("model_type") == AC_MODEL_TYPE:
        return VJEPA2ACConfig.from_dict(d, str(file))
    return VJEPA2Config.from_hf(d, str(file))


# The released encoders (next_models.md §3.2); ViT-g's MLP is 48/11 of its width.
ENCODER_PRESETS = {
    "vitl": ViTShape(1024, 24, 16, 4096),
    "vith": ViTShape(1280, 32, 16, 5120),
    "vitg": ViTShape(1408, 40, 22, 6144),
}
MASKED_PREDICTOR = MaskedPredictorConfig(ViTShape(384, 12, 12, 1536))
AC_PREDICTOR = ACPredictorConfig()


def released(name: str, crop_size: int = 256) -> VJEPA2Config:
    """The shape of ``facebook/vjepa2-{name}-fpc64-{crop_size}`` (name: vitl, vith, vitg)."""
    if name not in ENCODER_PRESETS:
        raise ConfigError(f"unknown V-JEPA 2 encoder {name!r} (known: {', '.join(ENCODER_PRESETS)})")
    return VJEPA2Config(EncoderConfig(ENCODER_PRESETS[name], crop_size=crop_size), MASKED_PREDICTOR)
