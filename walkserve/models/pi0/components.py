"""Building the served components of a pi0 / pi0.5 checkpoint on a rank: each loads only its own tensors.

    vision     VisionEncoder   vision_tower + multi_modal_projector      (stateless: ``forward_batch``)
    lm         PaliGemmaLM     language_model (+ the tied embedding)     (KV cache; kv_only: its K/V are its product)
    expert     ActionExpert    gemma_expert.model + the root projections (KV cache; reads ``hidden`` rows)
    flow_head  FlowHead        the root projections + the normaliser     (stateless: ``forward_batch``)
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from walkserve.models.common.safetensors_files import tensor_bytes
from walkserve.models.pi0.action_expert import ActionExpert
from walkserve.models.pi0.flow_head import FlowHead
from walkserve.models.pi0.normalizer import Normalizer
from walkserve.models.pi0.prefix_lm import PaliGemmaLM
from walkserve.models.pi0.vision import VisionEncoder
from walkserve.models.pi0.weights import load_component

PROGRESS_BAR_BYTES = 256 * 2**20


def build_component(part: str, path: str | Path, device: str, dtype: str | torch.dtype | None,
                    image_cache: int = 0) -> nn.Module:
    """The component ``part`` of the checkpoint at ``path``, loaded onto ``device`` (the vision encoder keeps the
    features of the ``image_cache`` most recent images)."""
    path = Path(path)
    progress = tensor_bytes(path) > PROGRESS_BAR_BYTES
    if part == "vision":
        return load_component(path, "vision", lambda c: VisionEncoder(c.vision, c.paligemma.hidden_size, image_cache),
                              device, dtype, progress)
    if part == "lm":
        return load_component(path, "lm", lambda c: PaliGemmaLM(c.paligemma, c.vocab_size, kv_only=True), device, dtype, progress)
    if part == "expert":
        return load_component(path, "expert", ActionExpert, device, dtype, progress)
    if part == "flow_head":
        return load_component(path, "expert", lambda c: FlowHead(c, Normalizer.from_dir(path, c.state_dim, c.action_dim)),
                              device, dtype)
    raise ValueError(f"a pi0 checkpoint has no component {part!r}")
