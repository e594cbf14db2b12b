"""Load a Llama / Qwen2 / Qwen3 checkpoint in the official HF layout into a CausalLM."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from walkserve.models.common.checkpoint import (
    SafetensorsCheckpoint,
    load_into,
    materialize,
    on_meta,
)
from walkserve.models.common.decoder import CausalLM
from walkserve.models.common.dtypes import resolve_dtype
from walkserve.models.common.lm_config import LMConfig


def load_causal_lm(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    progress: bool = True,
) -> CausalLM:
    """Read ``config.json`` and the safetensors weights of ``path`` into an eval-mode CausalLM.

    ``dtype`` defaults to the checkpoint's (``dtype`` / ``torch_dtype`` in
    config.json). Raises ConfigError for an unknown architecture or a
    missing, unexpected or mis-shaped tensor.
    """
    path = Path(path)
    checkpoint = SafetensorsCheckpoint(path)
    config = LMConfig.from_file(path)
    if _stored_head_differs(config, checkpoint):  # what transformers 5 does too: the stored head wins
        config = replace(config, tie_word_embeddings=False)
    with on_meta():
        model = CausalLM(config)
    materialize(model, device, resolve_dtype(dtype, config))
    load_into(model, checkpoint, ignored=model.checkpoint_ignored(), progress=progress)
    return model.eval()


def _stored_head_differs(config: LMConfig, checkpoint: SafetensorsCheckpoint) -> bool:
    """A tied config whose checkpoint still holds an ``lm_head.weight`` that is not the embedding."""
    names = ("lm_head.weight", "model.embed_tokens.weight")
    if not config.tie_word_embeddings or names[0] not in checkpoint.files:
        return False
    head, embed = (t for _, t in checkpoint.tensors(names, progress=False))
    return not torch.equal(head, embed)


def estimate_weight_bytes(path: str | Path, dtype: str | torch.dtype | None = None) -> int:
    """Bytes the weights of ``path`` take once loaded at ``dtype`` (read from file headers only)."""
    config = LMConfig.from_file(path)
    itemsize = torch.empty((), dtype=resolve_dtype(dtype, config)).element_size()
    return SafetensorsCheckpoint(path).nbytes(itemsize)
