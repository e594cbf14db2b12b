"""Load a SNAC checkpoint directory (``config.json`` + ``model.safetensors``) into a SnacDecoder.

Only safetensors are read here; a released ``pytorch_model.bin`` must first be
converted once with ``walkserve.models.snac.convert`` (the server never
unpickles). The file keeps the official names, weight normalisation included;
the loader folds each ``(g, v)`` pair into a plain weight
``w = g * v / ||v||`` (norm over every dim but the first) once, so decoding
pays nothing for it. Encoder tensors and the quantizer's ``in_proj`` (encode
side) are ignored; the attention's stored ``rel_pos.inv_freq`` is recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from walkserve.core.errors import ConfigError
from walkserve.models.common.checkpoint import on_meta
from walkserve.models.snac.config import SnacConfig
from walkserve.models.snac.decoder import SnacDecoder
from walkserve.models.snac.layout import WEIGHT_NORM_SUFFIXES, Slot, decoder_slots

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PICKLE_FILE = "pytorch_model.bin"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_NAMED = 8  # how many offending tensor names an error lists


def fold_weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``g * v / ||v||`` with the norm over every dim but 0 (``torch`` weight_norm with ``dim=0``), in float32."""
    v = v.float()  # v: [out, in / groups, k]  (ConvTranspose1d: [in, out, k])
    norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))  # norm: [out, 1, 1]
    return v * (g.float().reshape(norm.shape) / norm)


def _weight_norm_pair(
    tensors: Mapping[str, torch.Tensor], official: str
) -> tuple[torch.Tensor, torch.Tensor] | None:
    for g_suffix, v_suffix in WEIGHT_NORM_SUFFIXES:
        g, v = tensors.get(official + g_suffix), tensors.get(official + v_suffix)
        if g is not None and v is not None:
            return g, v
    return None


def _fetch(
    tensors: Mapping[str, torch.Tensor], slot: Slot, leaf: str, want: torch.Size
) -> tuple[torch.Tensor | None, str]:
    """The tensor for our ``leaf`` of ``slot`` (folded if weight-normalised), or None, and the name it was sought under."""
    if slot.weight_norm and leaf == "weight":
        name = slot.official + WEIGHT_NORM_SUFFIXES[0][1]
        pair = _weight_norm_pair(tensors, slot.official)
        if pair is None:
            return None, name
        g, v = pair
        if tuple(v.shape) != tuple(want) or g.numel() != v.shape[0]:
            raise _shape_error(name, v.shape, want, extra=f" (g has {g.numel()} values)")
        return fold_weight_norm(g, v), name
    name = f"{slot.official}.{leaf}"
    return tensors.get(name), name


def _shape_error(name: str, got: torch.Size, want: torch.Size, extra: str = "") -> ConfigError:
    return ConfigError(
        f"SNAC checkpoint: tensor {name} has shape {list(got)}, expected {list(want)}{extra}"
    )


def _named(names: list[str]) -> str:
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return ", ".join(names[:MAX_NAMED]) + more


def decoder_state_dict(
    cfg: SnacConfig, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Our SnacDecoder's state dict (float32, weight norm folded) from an official-layout tensor map."""
    with on_meta():
        shapes = {name: p.shape for name, p in SnacDecoder(cfg).named_parameters()}
    slots = decoder_slots(cfg)
    state: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    for name, want in shapes.items():
        prefix, _, leaf = name.rpartition(".")
        tensor, source = _fetch(tensors, slots[prefix], leaf, want)
        if tensor is None:
            missing.append(source)
        elif tuple(tensor.shape) != tuple(want):
            raise _shape_error(source, tensor.shape, want)
        else:
            state[name] = tensor.float()
    if missing:
        raise ConfigError(f"SNAC checkpoint: missing tensors {_named(missing)}")
    return state


def build_decoder(
    cfg: SnacConfig,
    tensors: Mapping[str, torch.Tensor],
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
) -> SnacDecoder:
    """A SnacDecoder in eval mode on ``device`` in ``dtype``, from official-layout tensors."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ConfigError(f"SNAC: unsupported dtype {dtype!r} (known: {', '.join(DTYPES)})")
        dtype = DTYPES[dtype]
    state = decoder_state_dict(cfg, tensors)
    with on_meta():
        model = SnacDecoder(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``<path>/model.safetensors``, on the CPU."""
    path = Path(path)
    file = path / WEIGHTS_FILE
    if not file.is_file():
        hint = ""
        if (path / PICKLE_FILE).is_file():
            hint = f"; convert {PICKLE_FILE} once with: python -m walkserve.models.snac.convert {path} {path}"
        raise ConfigError(f"SNAC checkpoint: {file} does not exist{hint}")
    try:
        return load_file(str(file), device="cpu")
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"SNAC checkpoint: cannot read {file}: {e}") from None


def load_snac(
    path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32"
) -> SnacDecoder:
    """Load the decoder of the SNAC checkpoint in directory ``path`` (``config.json`` + ``model.safetensors``)."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"SNAC checkpoint: {path} is not a directory")
    cfg = SnacConfig.from_file(path / CONFIG_FILE)
    return build_decoder(cfg, read_tensors(path), device=device, dtype=dtype)
