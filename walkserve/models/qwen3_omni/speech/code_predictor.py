"""The code predictor: a small dense LM that writes codes 1..15 of a frame (a KV-cache component).

Per frame it runs on a fresh 16-position context (1-D positions 0..15)::

    position:  0                    1                        2                       ... 15
    input:     talker hidden h_t    talker.embed(code 0)     E[0](code 1)            ... E[13](code 14)
    output:    -                    head[0] -> code 1        head[1] -> code 2       ... head[14] -> code 15

The 15 embeddings E[g] and heads head[g] (``model.codec_embedding.g``,
``lm_head.g``) are held stacked, so the component is a plain Qwen3 dense LM
(``common.decoder.CausalLM``) over a vocabulary of 15 x 2048 ids, id
``g * 2048 + c`` standing for code c of group g + 1: the id the head of step
g samples (restricted to block g, ``speech_rules.predictor_ranges``) is the
id the next step embeds, so the depth loop is an ordinary decode loop.
"""

from __future__ import annotations

import torch
from torch import nn

from walkserve.layers.linear import CheckpointParts, Linear
from walkserve.models.common.decoder import CausalLM
from walkserve.models.qwen3_omni.speech.config import CodePredictorConfig


class StackedEmbedding(nn.Embedding):
    """One table of ``groups`` blocks of ``size`` rows, read from ``<parent>.codec_embedding.{g}.weight``."""

    def __init__(self, groups: int, size: int, dim: int):
        super().__init__(groups * size, dim)
        self.groups, self.size = groups, size

    def checkpoint_parts(self, prefix: str) -> CheckpointParts:
        parent = prefix.rpartition(".")[0]
        parent = f"{parent}." if parent else ""
        return {f"{parent}codec_embedding.{g}.weight": ("weight", (slice(g * self.size, (g + 1) * self.size),))
                for g in range(self.groups)}


class StackedHead(Linear):
    """One head of ``groups`` blocks of ``size`` output rows, read from ``lm_head.{g}.weight``."""

    def __init__(self, dim: int, groups: int, size: int):
        super().__init__(dim, groups * size, bias=False)
        self.groups, self.size = groups, size

    def checkpoint_parts(self, prefix: str) -> CheckpointParts:
        return {f"{prefix}.{g}.weight": ("weight", (slice(g * self.size, (g + 1) * self.size),))
                for g in range(self.groups)}


class CodePredictor(CausalLM):
    """CausalLM over the stacked code vocabulary; ``config`` is the CodePredictorConfig (the engine reads it)."""

    def __init__(self, config: CodePredictorConfig):
        super().__init__(config.attention.as_lm_config(config.vocab_size, config.intermediate_size))
        self.lm_config = self.config
        self.config = config  # type: ignore[assignment]
        groups, size, dim = config.num_residual_groups, config.codebook_size, config.hidden_size
        self.model.embed_tokens = StackedEmbedding(groups, size, dim)
        self.lm_head = StackedHead(dim, groups, size)

    def stacked_id(self, group: int, code: torch.Tensor) -> torch.Tensor:
        """The vocabulary id of ``code`` in residual group ``group`` (1..15)."""
        return code + (group - 1) * self.config.codebook_size

    def codes(self, stacked_ids: torch.Tensor) -> torch.Tensor:
        """Stacked ids -> codes in 0..codebook_size-1 (the group is the block)."""
        return stacked_ids % self.config.codebook_size
