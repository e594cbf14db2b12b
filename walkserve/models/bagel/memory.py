"""What BAGEL's components take in memory, for the placement's check (torch-free, from the file headers).

    weights    per component, the bytes of its tensors as stored (or at the rank's dtype): lm is
               language_model.* of ema.safetensors (two experts: ~14B of the ~14.7B parameters); a
               token runs one expert, ~7B
    lm state   the KV pool (56 KiB per token in bf16 for the released LLM: 28 layers x 4 KV heads
               x 128 x K,V x 2 bytes) plus one step's activations: max_batch_tokens rows (the three
               4,098-row queries of a 1024x1024 step by default) through the widest layer

The released model, in bf16: lm ~28.2 GB, vit ~0.8 GB, the rest < 0.3 GB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from walkserve.models.bagel.config import AE_FILE, EMA_FILE, BagelConfig
from walkserve.models.common.kv_sizing import kv_bytes_per_token as common_kv_bytes_per_token
from walkserve.models.common.kv_sizing import kv_pool_bytes
from walkserve.models.common.lm_config import LMConfig
from walkserve.models.common.memory_report import GIB
from walkserve.models.common.safetensors_files import DTYPE_ITEMSIZE, ITEMSIZE, read_header

# ema.safetensors prefixes of each component (the VAE's are ae.safetensors')
PREFIXES = {
    "lm": ("language_model.",),
    "vit": ("vit_model.", "connector.", "vit_pos_embed."),
    "latents": ("time_embedder.", "vae2llm.", "llm2vae.", "latent_pos_embed."),
    "vae_encoder": ("encoder.",),
    "vae_decoder": ("decoder.",),
}
GEN_SUFFIX = "_moe_gen"
ACTIVATION_ITEMSIZE = 4  # float32 upper bound for intermediate activations
MARKERS = 2  # <|vision_start|>, <|vision_end|> around a query's latents


def kv_bytes_per_token(llm: LMConfig, itemsize: int = 2) -> int:
    """K and V of one token over every layer: 57,344 bytes (56 KiB) for the released LLM in bf16."""
    return common_kv_bytes_per_token(llm.num_hidden_layers, llm.num_key_value_heads, llm.head_dim, itemsize)


def query_rows(config: BagelConfig) -> int:
    """Rows of the largest denoising query: the latent table's full grid plus the two markers (4,098)."""
    return config.max_latent_size**2 + MARKERS


def default_max_batch_tokens(config: BagelConfig) -> int:
    """Tokens per KV-engine step: the three passes of the largest query fit one forward."""
    return max(2048, 3 * query_rows(config))


def step_activation_bytes(llm: LMConfig, rows: int) -> int:
    """A bound on one step's working set: ``rows`` rows through the widest layer (MLP in and out, attention)."""
    per_row = 2 * llm.hidden_size + 2 * llm.intermediate_size + llm.q_size + 2 * llm.kv_size
    return rows * per_row * ACTIVATION_ITEMSIZE


def _tensors(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    out = {}
    for file in (EMA_FILE, AE_FILE):
        for name, entry in read_header(path / file).items():
            out[name] = (tuple(entry["shape"]), entry["dtype"])
    return out


def weight_bytes(path: str | Path, dtype: str | None = None) -> dict[str, int]:
    """Bytes per component: as stored, or at ``dtype`` for the LLM (the others run in float32 by default)."""
    tensors = _tensors(Path(path))
    out = dict.fromkeys(PREFIXES, 0)
    for name, (shape, stored) in tensors.items():
        comp = next((c for c, prefixes in PREFIXES.items() if name.startswith(prefixes)), None)
        if comp is None:
            continue
        itemsize = DTYPE_ITEMSIZE[dtype] if dtype and comp == "lm" else ITEMSIZE.get(stored, 4)
        out[comp] += math.prod(shape) * itemsize
    return out


def parameter_counts(path: str | Path) -> tuple[int, int]:
    """(total, active) parameters: every tensor, and the LLM's that one token runs (one expert per layer,
    the shared embeddings and head): ~14.7B and ~7.6B for the released model."""
    total = active = 0
    for name, (shape, _) in _tensors(Path(path)).items():
        n = math.prod(shape)
        total += n
        if name.startswith("language_model.") and GEN_SUFFIX not in name:
            active += n
    return total, active


def lm_state_bytes(path: str | Path, options: Mapping[str, Any], device: str, free_bytes: int | None) -> int:
    """The lm component's state on ``device``: its KV pool and one step's activations."""
    config = BagelConfig.from_dir(path)
    llm = config.llm
    pool = kv_pool_bytes(options, kv_bytes_per_token(llm, 4), device, free_bytes)
    rows = int(options.get("max_batch_tokens") or default_max_batch_tokens(config))
    return pool + step_activation_bytes(llm, rows)


def describe(path: str | Path, hosted: Mapping[int, tuple[str, Sequence[str]]]) -> list[str]:
    """What ``walkserve serve`` prints: the checkpoint's sizes, then per rank (device, components) what it loads."""
    config = BagelConfig.from_dir(path)
    sizes = weight_bytes(path)
    total, active = parameter_counts(path)
    lines = [f"checkpoint {Path(path).name}: {total / 1e9:.2f}B parameters ({active / 1e9:.2f}B active per LLM token), "
             f"{sum(sizes.values()) / GIB:.2f} GiB as stored; KV {kv_bytes_per_token(config.llm) / 1024:g} KiB per "
             f"token in bf16; a flow step queries up to 3 x {query_rows(config):,} rows"]
    for rank, (device, components) in sorted(hosted.items()):
        parts = ", ".join(f"{c} {sizes[c] / GIB:.2f} GiB" for c in components)
        kv = "; plus lm's KV pool (its own contexts)" if "lm" in components else ""
        lines.append(f"rank {rank} ({device}): {parts}{kv}")
    return lines
