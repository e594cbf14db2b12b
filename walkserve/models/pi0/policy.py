"""Pi0Policy: the three components of a pi0 / pi0.5 checkpoint, and their names in lerobot's file.

    vision  VisionEncoder   stateless   cameras -> image tokens
    lm      PaliGemmaLM     KV cache    writes the prefix context (all layers)
    expert  ActionExpert    KV cache    queries the prefix context, layer l on layer l

lerobot's ``model.safetensors`` (every name may carry a leading ``model.``):

    paligemma_with_expert.paligemma.model.vision_tower.vision_model.*   vision.tower.*
    paligemma_with_expert.paligemma.model.multi_modal_projector.linear.* vision.projector.*
    paligemma_with_expert.paligemma.model.language_model.*              lm.*   (embed_tokens, layers, norm)
    paligemma_with_expert.paligemma.lm_head.weight                      the tied embedding (read if
                                                                        language_model.embed_tokens is absent)
    paligemma_with_expert.gemma_expert.model.*                          expert.* (layers, norm)
    paligemma_with_expert.gemma_expert.lm_head.weight                   unused
    action_in_proj, action_out_proj, time_mlp_{in,out} (pi0.5),
    state_proj, action_time_mlp_{in,out} (pi0)                          expert.*
"""

from __future__ import annotations

from torch import nn

from walkserve.models.pi0.action_expert import ActionExpert
from walkserve.models.pi0.config import PolicyConfig
from walkserve.models.pi0.names import (
    EMBEDDING,
    EXPERT,
    PALIGEMMA,
    TIED_HEAD,
    UNUSED,
    checkpoint_name,
)
from walkserve.models.pi0.prefix_lm import PaliGemmaLM
from walkserve.models.pi0.vision import VisionEncoder

__all__ = ["EMBEDDING", "EXPERT", "PALIGEMMA", "TIED_HEAD", "UNUSED", "Pi0Policy", "checkpoint_name"]


class Pi0Policy(nn.Module):
    def __init__(self, config: PolicyConfig, max_positions: int = 4096):
        super().__init__()
        self.config = config
        self.vision = VisionEncoder(config.vision, config.paligemma.hidden_size)
        self.lm = PaliGemmaLM(config.paligemma, config.vocab_size, max_positions)
        self.expert = ActionExpert(config, max_positions)
