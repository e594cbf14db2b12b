"""BagelConfig: the shapes of BAGEL's parts, read from a checkpoint directory as released (torch-free).

    ema.safetensors     the whole model (LLM, ViT, connector, latent embeddings), one file
    ae.safetensors      the FLUX.1 autoencoder, FLUX names (no config file: its shape is read from the tensors)
    llm_config.json     Qwen2 (Qwen2.5-7B); the official app forces qk_norm and untied embeddings
    vit_config.json     SigLIP so400m/14 at 980; the official app drops the last layer (26 of 27) and rope
    config.json         BAGEL-level fields (latent_patch_size, connector_act, interpolate_pos), optional

``max_latent_size`` and ``vit_max_num_patch_per_side`` are the sides of the
stored position tables (``latent_pos_embed.pos_embed`` [64², D] and
``vit_pos_embed.pos_embed`` [70², D] in the real checkpoint): the app passes
64 and 70, and a table of another size would not load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.models.common.config_files import read_config_json
from walkserve.models.common.lm_config import LMConfig
from walkserve.models.common.safetensors_files import read_header
from walkserve.models.siglip.config import SiglipVisionConfig

EMA_FILE = "ema.safetensors"
AE_FILE = "ae.safetensors"
LLM_CONFIG_FILE = "llm_config.json"
VIT_CONFIG_FILE = "vit_config.json"
CONFIG_FILE = "config.json"
LATENT_POS_KEY = "latent_pos_embed.pos_embed"
VIT_POS_KEY = "vit_pos_embed.pos_embed"
CONNECTOR_ACTS = ("gelu_pytorch_tanh",)


@dataclass(frozen=True)
class FluxAEConfig:
    """The FLUX.1 autoencoder: ``ch * ch_mult[i]`` channels at level i, ``num_res_blocks`` per level.

    FLUX.1-dev's (BAGEL's ``ae.safetensors``): ch 128, mult (1, 2, 4, 4), 2
    blocks, z 16, so an image is downsampled 8x; latents are stored as
    (z - shift_factor) * scale_factor.
    """

    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    z_channels: int = 16
    in_channels: int = 3
    out_ch: int = 3
    scale_factor: float = 0.3611
    shift_factor: float = 0.1159
    num_groups: int = 32

    def __post_init__(self) -> None:
        for width in {self.ch * m for m in self.ch_mult}:
            if width % self.num_groups:
                raise ConfigError(f"flux ae: {width} channels are not a multiple of {self.num_groups} norm groups")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @staticmethod
    def from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> FluxAEConfig:
        """The shape of an ``ae.safetensors`` from its tensor shapes (FLUX names)."""
        try:
            ch = shapes["encoder.conv_in.weight"][0]
            levels = 1 + max(int(k.split(".")[2]) for k in shapes if k.startswith("encoder.down."))
            blocks = 1 + max(int(k.split(".")[4]) for k in shapes if k.startswith("encoder.down.0.block."))
            mult = tuple(shapes[f"encoder.down.{i}.block.0.conv1.weight"][0] // ch for i in range(levels))
            z = shapes["encoder.conv_out.weight"][0] // 2
            in_ch = shapes["encoder.conv_in.weight"][1]
            out_ch = shapes["decoder.conv_out.weight"][0]
        except (KeyError, ValueError, IndexError) as e:
            raise ConfigError(f"{AE_FILE}: not a FLUX autoencoder ({e!r})") from None
        return FluxAEConfig(ch=ch, ch_mult=mult, num_res_blocks=blocks, z_channels=z, in_channels=in_ch, out_ch=out_ch)


@dataclass(frozen=True)
class BagelConfig:
    """Everything the components are built from."""

    llm: LMConfig
    vit: SiglipVisionConfig
    vae: FluxAEConfig
    latent_patch_size: int = 2
    max_latent_size: int = 64
    vit_max_num_patch_per_side: int = 70
    connector_act: str = "gelu_pytorch_tanh"
    timestep_freq_dim: int = 256

    def __post_init__(self) -> None:
        if self.connector_act not in CONNECTOR_ACTS:
            raise ConfigError(f"bagel: connector_act {self.connector_act!r} is not supported ({', '.join(CONNECTOR_ACTS)})")
        if self.vit.patches_per_side != self.vit_max_num_patch_per_side:
            raise ConfigError(
                f"bagel: the ViT has {self.vit.patches_per_side} patches per side but vit_pos_embed "
                f"{self.vit_max_num_patch_per_side}"
            )
        if not self.llm.qk_norm or self.llm.tie_word_embeddings:
            raise ConfigError("bagel: the LLM must have qk_norm and untied embeddings")

    @property
    def hidden_size(self) -> int:
        return self.llm.hidden_size

    @property
    def latent_dim(self) -> int:
        """Values per latent token: patch x patch x z channels (64)."""
        return self.latent_patch_size**2 * self.vae.z_channels

    @property
    def latent_downsample(self) -> int:
        """Pixels per latent token side: VAE downsample x latent patch (16)."""
        return self.vae.downsample * self.latent_patch_size

    @property
    def max_image_side(self) -> int:
        """The largest generated side in pixels the latent position table covers (1024)."""
        return self.max_latent_size * self.latent_downsample

    @classmethod
    def from_dir(cls, path: str | Path) -> BagelConfig:
        """Read a checkpoint directory in the released layout (see the module docstring)."""
        path = Path(path)
        top = read_config_json(path / CONFIG_FILE) if (path / CONFIG_FILE).is_file() else {}
        if top.get("interpolate_pos"):
            raise ConfigError(f"{path}: interpolate_pos is not supported (the released model extrapolates)")
        llm = _sub_config(path, LLM_CONFIG_FILE, top, "llm_config")
        vit = _sub_config(path, VIT_CONFIG_FILE, top, "vit_config")
        llm_config = replace(LMConfig.from_hf(llm), qk_norm=True, tie_word_embeddings=False)
        vit_config = SiglipVisionConfig.from_dict(vit)
        vit_config = replace(vit_config, num_hidden_layers=vit_config.num_hidden_layers - 1)
        ema = _shapes(path / EMA_FILE)
        ae = _shapes(path / AE_FILE)
        return cls(
            llm=llm_config,
            vit=vit_config,
            vae=FluxAEConfig.from_shapes(ae),
            latent_patch_size=int(top.get("latent_patch_size", 2)),
            max_latent_size=_table_side(ema, LATENT_POS_KEY),
            vit_max_num_patch_per_side=_table_side(ema, VIT_POS_KEY),
            connector_act=top.get("connector_act", "gelu_pytorch_tanh"),
        )


def _sub_config(path: Path, file: str, top: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """The official app reads the json file; config.json's copy is the fallback."""
    if (path / file).is_file():
        return read_config_json(path / file)
    if isinstance(top.get(key), Mapping):
        return top[key]
    raise ConfigError(f"{path}: no {file} (and config.json has no {key})")


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    if not path.is_file():
        raise ConfigError(f"no {path.name} at {path.parent}")
    return {name: tuple(entry["shape"]) for name, entry in read_header(path).items()}


def _table_side(shapes: Mapping[str, tuple[int, ...]], key: str) -> int:
    if key not in shapes:
        raise ConfigError(f"{EMA_FILE}: no {key}")
    side = math.isqrt(shapes[key][0])
    if side * side != shapes[key][0]:
        raise ConfigError(f"{EMA_FILE}: {key} has {shapes[key][0]} rows, not a square table")
    return side
