"""PaliGemmaLM: the prefix transformer of pi0 / pi0.5 (gemma_2b), a KV-cache component.

It reads the prefix once per request, images and prompt together, and
leaves its per-layer K/V for the action expert to attend to:

    prefix = [camera 0: 256 image tokens | camera 1 | ... | prompt tokens]
    inputs_embeds = [projected SigLIP features (unscaled) | embed(ids) * sqrt(D)]
    attention: bidirectional over the prefix's valid tokens (mask kind "full")
    positions: cumsum(valid) - 1, so absent cameras and padding take none

Tokens of several requests are concatenated (ragged, [T, D]); the attention
context says which see which. The hidden states after the final norm are
returned to honour the component interface, but nothing downstream reads
them: the product of this component is its K/V. Served, it is built with
``kv_only``: the last layer stops once its K/V are written (its o_proj, MLP
and the final norm would only make the unread hidden states; at the bench
preset's 6 layers that is ~14% of the prefix's FLOPs, ~5% at gemma_2b's 18),
and the rows it returns are that layer's input.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from walkserve.layers.attention import AttentionContext
from walkserve.layers.cpu_linear import linear
from walkserve.models.pi0.config import GemmaSize
from walkserve.models.pi0.gemma import GemmaStack
from walkserve.models.pi0.norms import GemmaRMSNorm


class PaliGemmaLM(GemmaStack):
    """Parameter names are the checkpoint's under ``paligemma_with_expert.paligemma.model.language_model.``.

    ``config`` carries the KV geometry (``num_hidden_layers``, ``num_key_value_heads``,
    ``head_dim``, ``hidden_size``); ``vocab_size`` is PaliGemma's.
    """

    def __init__(self, size: GemmaSize, vocab_size: int, max_positions: int = 4096, kv_only: bool = False):
        super().__init__(size, lambda dim: GemmaRMSNorm(dim, size.rms_norm_eps), max_positions)
        self.vocab_size = vocab_size
        self.kv_only = kv_only  # served: only the K/V are read, so the last layer's o_proj and MLP are skipped
        self.embed_tokens = nn.Embedding(vocab_size, size.hidden_size)
        self.embed_scale = math.sqrt(size.hidden_size)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Language embeddings scaled by sqrt(width): ids [T] -> [T, D]."""
        weight = self.embed_tokens.weight
        return self.embed_tokens(input_ids) * torch.tensor(self.embed_scale, dtype=weight.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states after the final norm [T, D]; ``inputs_embeds`` [T, D] replaces the lookup
        (the prefix builder splices image features in; ids are then ignored). With ``kv_only`` the K/V
        are the same and the rows returned are the last layer's input (``GemmaStack.run_layers``)."""
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # [T, D]
        return self.run_layers(x, positions, attn, kv_only=self.kv_only)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied head (the embedding), float32: hidden [N, D] -> [N, V]. Not used by the policies."""
        return linear(hidden, self.embed_tokens.weight).float()
