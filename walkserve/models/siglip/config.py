"""SigLIP vision configuration, read from the ``vision_config`` of an HF config (or a SiglipVisionConfig file)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from walkserve.core.errors import ConfigError

ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


@dataclass(frozen=True)
class SiglipVisionConfig:
    """The tower's shape. ``image_size // patch_size`` patches per side index the position table."""

    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_hidden_layers: int = 27
    num_attention_heads: int = 16
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 14
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"siglip: hidden_size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"siglip: hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.image_size % self.patch_size:
            raise ConfigError(f"siglip: image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_positions(self) -> int:
        return self.patches_per_side**2

    @property
    def patch_dim(self) -> int:
        """Values per flattened patch, in (channel, row, col) order."""
        return self.num_channels * self.patch_size**2

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> SiglipVisionConfig:
        """From an HF dict: a SiglipVisionConfig's keys, or a parent config holding ``vision_config``."""
        d = d.get("vision_config", d)
        names = SiglipVisionConfig.__dataclass_fields__
        return SiglipVisionConfig(**{k: v for k, v in d.items() if k in names})
