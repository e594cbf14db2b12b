"""The V-JEPA 2-AC predictor: a KV-cache component (the interface the paged-KV engine drives).

    inputs_embeds [T, E], token_kind [T]    (layout: ``step_tokens``)
      frame rows  -> predictor_embed  (E -> D)
      action rows -> action_encoder   (7 -> D)
      state rows  -> state_encoder    (7 -> D)
    -> L x Block (3-D RoPE at positions [3, T]; attention through the AttentionContext)
    -> predictor_norm -> hidden [T, D]
    hidden [N, D] -> compute_logits: predictor_proj -> features [N, E] float32
    (then the caller's F.layer_norm with no affine, as the released rollout does)

The released model attends block-causally by step (``step_tokens.step_mask``);
the context owns the mask and the K/V. Checkpoint names: ``predictor.`` +
``predictor_embed``, ``action_encoder``, ``state_encoder``, ``layer.N.*``
(the released ``predictor_blocks.N`` with its fused ``attn.qkv`` split by the
converter), ``predictor_norm``, ``predictor_proj``; the released
``extrinsics_encoder`` is kept in the file and not read.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from walkserve.layers.attention import AttentionContext
from walkserve.layers.linear import Linear
from walkserve.models.vjepa2.block import Block
from walkserve.models.vjepa2.config import ACPredictorConfig
from walkserve.models.vjepa2.rope3d import Rope3D
from walkserve.models.vjepa2.step_tokens import ACTION, FRAME, STATE, step_kinds

IGNORED = ("extrinsics_encoder.weight", "extrinsics_encoder.bias")


class ACPredictor(nn.Module):
    """Action-conditioned next-frame predictor over ragged token batches."""

    def __init__(self, config: ACPredictorConfig):
        super().__init__()
        c = self.config = config
        self.predictor_embed = Linear(c.input_size, c.hidden_size, bias=True)
        self.action_encoder = Linear(c.action_dim, c.hidden_size, bias=True)
        self.state_encoder = Linear(c.action_dim, c.hidden_size, bias=True)
        self.layer = nn.ModuleList(Block(c.vit) for _ in range(c.num_hidden_layers))
        self.predictor_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.predictor_proj = Linear(c.hidden_size, c.input_size, bias=True)
        self.rope = Rope3D(c.head_dim)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """No vocabulary: ids [T] embed to zero rows [T, E] that ``inputs_embeds`` must overwrite."""
        weight = self.predictor_embed.weight
        return weight.new_zeros(input_ids.shape[0], self.config.input_size)

    def embed_rows(self, inputs_embeds: torch.Tensor, token_kind: torch.Tensor) -> torch.Tensor:
        """The input projections: rows [T, E] of kinds [T] -> [T, D]."""
        a = self.config.action_dim
        x = inputs_embeds.new_empty(inputs_embeds.shape[0], self.config.hidden_size)  # [T, D]
        for kind, project, width in ((FRAME, self.predictor_embed, None), (ACTION, self.action_encoder, a),
                                     (STATE, self.state_encoder, a)):
            rows = (token_kind == kind).nonzero().squeeze(-1)  # [n]
            x[rows] = project(inputs_embeds[rows, :width])  # [n, D]
        return x

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        attn: AttentionContext,
        inputs_embeds: torch.Tensor | None = None,
        token_kind: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states after ``predictor_norm``, [T, D].

        ``inputs_embeds`` [T, E] is required (``input_ids`` is ignored);
        ``positions`` [3, T] are (t, row, col); ``token_kind`` [T] says which
        rows are actions, states or frame tokens, and defaults to whole steps
        in the standard layout (T a multiple of ``tokens_per_step``).
        """
        if inputs_embeds is None:
            raise ValueError("V-JEPA 2-AC takes inputs_embeds (actions, states, frame tokens), not token ids")
        t = inputs_embeds.shape[0]
        if token_kind is None:
            token_kind = self._whole_steps(t, inputs_embeds.device)
        x = self.embed_rows(inputs_embeds.to(self.predictor_embed.weight.dtype), token_kind)  # [T, D]
        cos, sin = self.rope.cos_sin(positions)  # [T, Dh]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for i, block in enumerate(self.layer):
            x = block(x, cos, sin, partial(attn.forward, i))  # [T, D]
        return self.predictor_norm(x)  # [T, D]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head: hidden [N, D] -> predicted frame features [N, E] float32 (``predictor_proj``; not logits)."""
        return self.predictor_proj(hidden).float()

    def _whole_steps(self, t: int, device: torch.device) -> torch.Tensor:
        per_step = self.config.tokens_per_step
        if t % per_step:
            raise ValueError(f"V-JEPA 2-AC: {t} tokens are not whole steps of {per_step}; pass token_kind")
        return step_kinds(t // per_step, self.config.frame_tokens, device=device)

    def checkpoint_ignored(self) -> tuple[str, ...]:
        """Checkpoint tensors that are present but not read."""
        return IGNORED
