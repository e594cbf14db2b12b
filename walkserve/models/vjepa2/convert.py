"""One-time conversion of Meta's released ``vjepa2-ac-vitg.pt`` to safetensors + our config.json.

    walkserve convert vjepa2-ac IN.pt OUT_DIR

The pickle is read once with ``torch.load(weights_only=True)`` (tensors and
plain containers only; memory-mapped when the file allows). Its ``encoder``
and ``predictor`` state dicts are renamed (leading ``module.`` / ``backbone.``
dropped), every fused ``attn.qkv`` is split into query/key/value along dim 0:

    encoder   patch_embed.proj.*            -> encoder.embeddings.patch_embeddings.proj.*
              blocks.N.attn.qkv.*           -> encoder.layer.N.attention.{query,key,value}.*
              blocks.N.attn.proj.*          -> encoder.layer.N.attention.proj.*
              blocks.N.{norm1,norm2,mlp.*}  -> encoder.layer.N.{norm1,norm2,mlp.*}
              norm.*                        -> encoder.layernorm.*
              pos_embed                     (a spare sin-cos table; RoPE is used) dropped
    predictor predictor_blocks.N.*          -> predictor.layer.N.* (attn -> attention, qkv split)
              predictor_embed, action_encoder, state_encoder, extrinsics_encoder,
              predictor_norm, predictor_proj -> predictor.<same name>

and written as ``model-0000i-of-0000N.safetensors`` shards (at most
``shard_bytes`` each) + ``model.safetensors.index.json``, or one
``model.safetensors`` when small. Sizes are read from the tensors; the head
counts (not visible in any shape) default to the released ones by width.
Any other key is an error: nothing is dropped silently.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from walkserve.core.errors import ConfigError
from walkserve.models.common.safetensors_files import INDEX_FILE, SINGLE_FILE
from walkserve.models.vjepa2.config import (
    CONFIG_FILE,
    ACPredictorConfig,
    EncoderConfig,
    ViTShape,
    VJEPA2ACConfig,
)

RELEASED_HEADS = {1024: 16, 1280: 16, 1408: 22}  # width -> heads of the released stacks (head_dim 64 / 80 / 64)
DROPPED = ("pos_embed",)
SHARD_BYTES = 2 << 30
_PREFIXES = ("module.", "backbone.")
_BLOCK = re.compile(r"^(blocks|predictor_blocks)\.(\d+)\.(.+)$")
_ENCODER_RENAMES = {"patch_embed.proj.": "embeddings.patch_embeddings.proj.", "norm.": "layernorm."}
_PREDICTOR_KEEP = ("predictor_embed.", "action_encoder.", "state_encoder.", "extrinsics_encoder.",
                   "predictor_norm.", "predictor_proj.")


def _strip(key: str) -> str:
    while key.startswith(_PREFIXES):
        key = key.split(".", 1)[1]
    return key


def _block(index: str, rest: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """One block tensor under our names (``layer.N.*``); a fused qkv becomes three."""
    base = f"layer.{index}."
    if rest.startswith("attn.qkv."):
        leaf = rest.rsplit(".", 1)[1]
        q, k, v = value.chunk(3, dim=0)
        return {f"{base}attention.{n}.{leaf}": t.contiguous() for n, t in zip(("query", "key", "value"), (q, k, v))}
    return {base + rest.replace("attn.", "attention.", 1): value}


def map_encoder(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The released encoder state dict -> ours, under ``encoder.``."""
    out: dict[str, torch.Tensor] = {}
    for raw, value in state.items():
        key = _strip(raw)
        block = _BLOCK.match(key)
        if block and block.group(1) == "blocks":
            out.update(_block(block.group(2), block.group(3), value))
        elif key in DROPPED:
            continue
        else:
            renamed = next((new + key[len(old):] for old, new in _ENCODER_RENAMES.items() if key.startswith(old)), None)
            if renamed is None:
                raise ConfigError(f"V-JEPA 2-AC conversion: unexpected encoder tensor {raw!r}")
            out[renamed] = value
    return {"encoder." + k: v for k, v in out.items()}


def map_predictor(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The released AC predictor state dict -> ours, under ``predictor.``."""
    out: dict[str, torch.Tensor] = {}
    for raw, value in state.items():
        key = _strip(raw)
        block = _BLOCK.match(key)
        if block and block.group(1) == "predictor_blocks":
            out.update(_block(block.group(2), block.group(3), value))
        elif key.startswith(_PREDICTOR_KEEP):
            out[key] = value
        else:
            raise ConfigError(f"V-JEPA 2-AC conversion: unexpected predictor tensor {raw!r}")
    return {"predictor." + k: v for k, v in out.items()}


def _heads(width: int, given: int | None, what: str) -> int:
    if given is not None:
        return given
    if width not in RELEASED_HEADS:
        raise ConfigError(f"V-JEPA 2-AC conversion: {what} width {width} is not a released one; pass its heads")
    return RELEASED_HEADS[width]


def _layers(tensors: dict[str, torch.Tensor], prefix: str) -> int:
    return len({k[len(prefix) :].split(".", 1)[0] for k in tensors if k.startswith(prefix)})


def infer_config(tensors: dict[str, torch.Tensor], crop_size: int = 256, max_steps: int = 32,
                 encoder_heads: int | None = None, predictor_heads: int | None = None,
                 source: str = "") -> VJEPA2ACConfig:
    """Our config for converted tensors (our names): sizes from the shapes, heads from the released widths."""
    try:
        width, chans, tubelet, patch, _ = tensors["encoder.embeddings.patch_embeddings.proj.weight"].shape
        inner = tensors["encoder.layer.0.mlp.fc1.weight"].shape[0]
        d, e_in = tensors["predictor.predictor_embed.weight"].shape
        action_dim = tensors["predictor.action_encoder.weight"].shape[1]
        p_inner = tensors["predictor.layer.0.mlp.fc1.weight"].shape[0]
    except KeyError as e:
        raise ConfigError(f"V-JEPA 2-AC conversion: missing tensor {e}") from None
    enc = ViTShape(width, _layers(tensors, "encoder.layer."), _heads(width, encoder_heads, "encoder"), inner,
                   qkv_bias="encoder.layer.0.attention.query.bias" in tensors)
    encoder = EncoderConfig(enc, patch_size=patch, tubelet_size=tubelet, crop_size=crop_size, in_chans=chans)
    predictor = ACPredictorConfig(
        d, _layers(tensors, "predictor.layer."), _heads(d, predictor_heads, "predictor"), p_inner, input_size=e_in,
        grid_size=crop_size // patch, max_steps=max_steps, action_dim=action_dim,
        qkv_bias="predictor.layer.0.attention.query.bias" in tensors,
    )
    dtype = str(tensors["encoder.layernorm.weight"].dtype).removeprefix("torch.")
    return VJEPA2ACConfig(encoder, predictor, dtype=dtype, source=source)


def read_released(path: str | Path) -> tuple[dict, dict, list[str]]:
    """The ``encoder`` and ``predictor`` state dicts of a released pickle, and the other top-level keys."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"V-JEPA 2-AC conversion: {file} does not exist")
    try:
        try:
            obj = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # a legacy (non-zip) pickle cannot be memory-mapped
            obj = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # the unpickler raises many types; all mean "not plain tensors"
        raise ConfigError(f"V-JEPA 2-AC conversion: cannot read {file} weights-only: {e}") from None
    if not isinstance(obj, dict) or not all(isinstance(obj.get(k), dict) for k in ("encoder", "predictor")):
        raise ConfigError(f"V-JEPA 2-AC conversion: {file} does not hold 'encoder' and 'predictor' state dicts")
    for part in ("encoder", "predictor"):
        bad = [str(k) for k, v in obj[part].items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise ConfigError(f"V-JEPA 2-AC conversion: {part} has non-tensor entries {bad[:8]}")
    return obj["encoder"], obj["predictor"], sorted(str(k) for k in obj if k not in ("encoder", "predictor"))


def write_shards(tensors: dict[str, torch.Tensor], out: Path, shard_bytes: int = SHARD_BYTES) -> list[Path]:
    """Safetensors files of at most ~``shard_bytes`` each (one ``model.safetensors`` when everything fits)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    if len(groups) == 1:
        save_file({n: tensors[n].contiguous() for n in groups[0]}, str(out / SINGLE_FILE), metadata={"format": "pt"})
        return [out / SINGLE_FILE]
    files, weight_map = [], {}
    for i, names in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in names}, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
        files.append(out / file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return files


def convert_vjepa2_ac(src: str | Path, out_dir: str | Path, crop_size: int = 256, max_steps: int = 32,
                      encoder_heads: int | None = None, predictor_heads: int | None = None,
                      shard_bytes: int = SHARD_BYTES) -> tuple[Path, list[str]]:
    """Convert a released AC pickle; returns (OUT_DIR, the top-level keys that were not converted)."""
    encoder, predictor, others = read_released(src)
    tensors = {**map_encoder(encoder), **map_predictor(predictor)}
    config = infer_config(tensors, crop_size, max_steps, encoder_heads, predictor_heads, source=Path(src).name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_shards(tensors, out, shard_bytes)
    (out / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    return out, others
