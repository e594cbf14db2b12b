"""RopeConfig: the rotary-embedding settings of a model, parsed from an HF config (torch-free).

Both spellings found in real checkpoints are read:

    transformers 5:   "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32, ...}
    older releases:   "rope_theta": 5e5, "rope_scaling": {"type" | "rope_type": "llama3", "factor": 32, ...}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from walkserve.core.errors import ConfigError

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding settings.

    ``mrope_section`` (and ``mrope_interleaved``) describe multimodal rope with
    3-D position ids (temporal, height, width): ``RotaryEmbedding`` then takes
    positions ``[3, T]`` and gives each frequency the angle of its axis
    (``walkserve.layers.rope.mrope_axes``).
    """

    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    partial_rotary_factor: float = 1.0
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(f"unsupported rope type {self.rope_type!r} (supported: {', '.join(ROPE_TYPES)})")
        if not self.theta > 0:
            raise ConfigError(f"rope_theta must be > 0, got {self.theta}")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ConfigError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")
        if self.rope_type in ("linear", "llama3") and not self.factor > 0:
            raise ConfigError(f"rope {self.rope_type}: factor must be > 0, got {self.factor}")
        if self.rope_type == "llama3":
            if self.original_max_position_embeddings is None or self.original_max_position_embeddings <= 0:
                raise ConfigError("rope llama3 needs original_max_position_embeddings > 0")
            if not self.high_freq_factor > self.low_freq_factor > 0:
                raise ConfigError(
                    f"rope llama3 needs high_freq_factor > low_freq_factor > 0, got "
                    f"{self.high_freq_factor} and {self.low_freq_factor}"
                )

    def rotary_dim(self, head_dim: int) -> int:
        """How many leading dims of each head are rotated (even)."""
        dim = int(head_dim * self.partial_rotary_factor)
        if dim % 2:
            raise ConfigError(f"rotary dim {dim} (head_dim {head_dim} x {self.partial_rotary_factor}) must be even")
        return dim

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> RopeConfig:
        """Parse the rope fields of an HF ``config.json`` dict (either spelling)."""
        params = config.get("rope_parameters")
        if params is None:
            scaling = config.get("rope_scaling") or {}
            if not isinstance(scaling, Mapping):
                raise ConfigError(f"rope_scaling must be an object, got {scaling!r}")
            params = {**scaling}
            params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
        if not isinstance(params, Mapping):
            raise ConfigError(f"rope_parameters must be an object, got {params!r}")
        if params and all(isinstance(v, Mapping) for v in params.values()):
            raise ConfigError(f"per-layer-type rope parameters ({', '.join(params)}) are not supported")
        return cls._from_params(params, config)

    @classmethod
    def _from_params(cls, params: Mapping[str, Any], config: Mapping[str, Any]) -> RopeConfig:
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "mrope":  # older Qwen2-VL spelling: default rope with 3-D sections
            rope_type = "default"
        original = params.get("original_max_position_embeddings")
        if original is None and rope_type == "llama3":
            original = config.get("max_position_embeddings")
        section = params.get("mrope_section")
        if rope_type in ("linear", "llama3") and "factor" not in params:
            raise ConfigError(f"rope {rope_type} needs a factor")
        numbers = {
            "rope_theta": params.get("rope_theta", config.get("rope_theta", 10000.0)),
            "factor": params.get("factor", 1.0),
            "low_freq_factor": params.get("low_freq_factor", 1.0),
            "high_freq_factor": params.get("high_freq_factor", 4.0),
            "partial_rotary_factor": params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)),
        }
        for name, value in numbers.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigError(f"rope {name} must be a number, got {value!r}")
        if original is not None and (not isinstance(original, (int, float)) or isinstance(original, bool)):
            raise ConfigError(f"rope original_max_position_embeddings must be an integer, got {original!r}")
        return cls(
            rope_type=str(rope_type),
            theta=float(numbers["rope_theta"]),
            factor=float(numbers["factor"]),
            low_freq_factor=float(numbers["low_freq_factor"]),
            high_freq_factor=float(numbers["high_freq_factor"]),
            original_max_position_embeddings=None if original is None else int(original),
            partial_rotary_factor=float(numbers["partial_rotary_factor"]),
            mrope_section=None if section is None else tuple(int(s) for s in section),
            mrope_interleaved=bool(params.get("mrope_interleaved", params.get("interleaved", False))),
        )

    def to_hf_parameters(self) -> dict[str, Any]:
        """The transformers-5 ``rope_parameters`` dict for this config."""
        out: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.theta}
        if self.rope_type in ("linear", "llama3"):
            out["factor"] = self.factor
        if self.rope_type == "llama3":
            out["low_freq_factor"] = self.low_freq_factor
            out["high_freq_factor"] = self.high_freq_factor
            out["original_max_position_embeddings"] = self.original_max_position_embeddings
        if self.partial_rotary_factor != 1.0:
            out["partial_rotary_factor"] = self.partial_rotary_factor
        if self.mrope_section is not None:
            out["mrope_section"] = list(self.mrope_section)
            out["mrope_interleaved"] = self.mrope_interleaved
        return out
