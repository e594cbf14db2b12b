"""SnacConfig: the hyper-parameters of a SNAC codec, as in its ``config.json`` (torch-free).

The official 24 kHz checkpoint (``hubertsiuzdak/snac_24khz``) reads::

    {"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8],
     "decoder_dim": 1024, "decoder_rates": [8, 8, 4, 2], "attn_window_size": null,
     "codebook_size": 4096, "codebook_dim": 8, "vq_strides": [4, 2, 1],
     "noise": true, "depthwise": true}

Codes come in ``len(vq_strides)`` levels; level ``l`` has one code per
``vq_strides[l]`` latent steps, and one latent step is
``prod(decoder_rates)`` output samples. So one level-0 code spans
``frame_samples = vq_strides[0] * prod(decoder_rates)`` samples (2048 at 24 kHz).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.models.common.config_files import read_config_json

ATTN_HEAD_DIM = 64  # the local attention always uses 64-wide heads


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@dataclass(frozen=True)
class SnacConfig:
    """SNAC hyper-parameters (field names and defaults match ``config.json`` of the 24 kHz model)."""

    sampling_rate: int = 24000
    encoder_dim: int = 48
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)
    latent_dim: int | None = None
    decoder_dim: int = 1024
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    attn_window_size: int | None = None
    codebook_size: int = 4096
    codebook_dim: int = 8
    vq_strides: tuple[int, ...] = (4, 2, 1)
    noise: bool = True
    depthwise: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        positive = {
            "sampling_rate": [self.sampling_rate],
            "encoder_dim": [self.encoder_dim],
            "decoder_dim": [self.decoder_dim],
            "codebook_size": [self.codebook_size],
            "codebook_dim": [self.codebook_dim],
            "encoder_rates": list(self.encoder_rates),
            "decoder_rates": list(self.decoder_rates),
            "vq_strides": list(self.vq_strides),
        }
        for name, values in positive.items():
            if not values or any(
                not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values
            ):
                raise ConfigError(
                    f"SNAC config: {name} must be positive integers, got {getattr(self, name)!r}"
                )
        if self.latent_dim is not None and self.latent_dim < 1:
            raise ConfigError(f"SNAC config: latent_dim must be positive, got {self.latent_dim}")
        if self.decoder_dim % (2 ** len(self.decoder_rates)):
            raise ConfigError(
                f"SNAC config: decoder_dim {self.decoder_dim} must be divisible by 2**len(decoder_rates)"
            )
        if any(self.vq_strides[0] % s for s in self.vq_strides):
            raise ConfigError(
                f"SNAC config: vq_strides {list(self.vq_strides)} must all divide the first"
            )
        self._check_attention()

    def _check_attention(self) -> None:
        window = self.attn_window_size
        if window is None:
            return
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ConfigError(
                f"SNAC config: attn_window_size must be a positive integer or null, got {window!r}"
            )
        if self.decoder_dim % ATTN_HEAD_DIM:
            raise ConfigError(
                f"SNAC config: decoder_dim {self.decoder_dim} must be a multiple of {ATTN_HEAD_DIM} "
                "when attn_window_size is set"
            )

    @property
    def latent(self) -> int:
        """Channels of the quantized latent (``latent_dim`` or ``encoder_dim * 2**len(encoder_rates)``)."""
        return self.latent_dim or self.encoder_dim * 2 ** len(self.encoder_rates)

    @property
    def hop_length(self) -> int:
        return math.prod(self.encoder_rates)

    @property
    def upsample(self) -> int:
        """Output samples per latent step."""
        return math.prod(self.decoder_rates)

    @property
    def frame_samples(self) -> int:
        """Output samples per level-0 code."""
        return self.vq_strides[0] * self.upsample

    @property
    def n_levels(self) -> int:
        return len(self.vq_strides)

    def level_lengths(self, n0: int) -> tuple[int, ...]:
        """Codes per level for ``n0`` level-0 codes."""
        return tuple(n0 * self.vq_strides[0] // s for s in self.vq_strides)

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` form (lists, and no ``latent_dim`` when it is derived)."""
        d = asdict(self)
        d.pop("extra")
        for key in ("encoder_rates", "decoder_rates", "vq_strides"):
            d[key] = list(d[key])
        if d["latent_dim"] is None:
            d.pop("latent_dim")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "config") -> SnacConfig:
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        unknown = sorted(k for k in d if k not in known and not k.startswith("_"))
        if unknown:
            raise ConfigError(f"{source}: unknown SNAC config keys {unknown}")
        kwargs = {k: d[k] for k in known if k in d}
        for key in ("encoder_rates", "decoder_rates", "vq_strides"):
            if key in kwargs:
                try:
                    kwargs[key] = _ints(kwargs[key])
                except (TypeError, ValueError):
                    raise ConfigError(f"{source}: {key} must be a list of integers") from None
        extra = {k: v for k, v in d.items() if k.startswith("_")}
        try:
            return cls(**kwargs, extra=extra)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> SnacConfig:
        return cls.from_dict(read_config_json(path, label="SNAC checkpoint: "), source=str(path))


PRESETS: dict[str, SnacConfig] = {
    # The released hubertsiuzdak/snac_24khz codec (~19.8M parameters).
    "full": SnacConfig(),
    # Same rates, strides and codebook (so 2048 samples per level-0 code), tiny widths.
    "tiny": SnacConfig(encoder_dim=2, decoder_dim=64),
}
