"""The V-JEPA 2 masked predictor (the ``predict`` task): features of context tokens -> features at target tokens.

    context [B, Nc, E] -> predictor_embeddings -> [B, Nc, P]
    targets: mask token ``mask_index`` at every target index -> [B, Nt, P]
    [context | targets] -> L x Block (3-D RoPE of each token's index on the crop grid)
      -> layernorm -> the target rows -> proj -> [B, Nt, E]

Token indices are raster indices (t, row, col) of the encoder's output on the
config's ``crop_size`` square grid: the released code and transformers both
derive positions from that grid, so the predictor is meaningful only for
inputs of exactly ``crop_size``². Attention is bidirectional and RoPE carries
the positions, so the order of the tokens does not matter (the references sort
them by index first; we do not).
"""

from __future__ import annotations

import torch
from torch import nn

from walkserve.layers.linear import Linear
from walkserve.models.vjepa2.block import Block, full_attention
from walkserve.models.vjepa2.config import EncoderConfig, MaskedPredictorConfig
from walkserve.models.vjepa2.rope3d import Rope3D, index_positions


class PredictorEmbeddings(nn.Module):
    def __init__(self, config: MaskedPredictorConfig, encoder_width: int):
        super().__init__()
        width = config.vit.hidden_size
        self.predictor_embeddings = Linear(encoder_width, width, bias=True)
        self.mask_tokens = nn.Parameter(torch.zeros(config.num_mask_tokens, 1, 1, width))  # HF's [M, 1, 1, P]


class MaskedPredictor(nn.Module):
    """Predicts encoder features at target token indices from the features at context indices."""

    def __init__(self, config: MaskedPredictorConfig, encoder: EncoderConfig):
        super().__init__()
        self.config, self.grid = config, encoder.grid_size
        self.embeddings = PredictorEmbeddings(config, encoder.hidden_size)
        self.layer = nn.ModuleList(Block(config.vit) for _ in range(config.vit.num_hidden_layers))
        self.layernorm = nn.LayerNorm(config.vit.hidden_size, eps=config.vit.layer_norm_eps)
        self.proj = Linear(config.vit.hidden_size, encoder.hidden_size, bias=True)
        self.rope = Rope3D(config.vit.head_dim)

    def forward(self, context: torch.Tensor, context_ids: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
        """context [B, Nc, E] at indices context_ids [B, Nc] -> predictions [B, Nt, E] at target_ids [B, Nt]."""
        b, n_ctx = context_ids.shape
        n_tgt = target_ids.shape[1]
        mask_token = self.embeddings.mask_tokens[self.config.mask_index % self.config.num_mask_tokens]  # [1, 1, P]
        x = torch.cat([self.embeddings.predictor_embeddings(context),  # [B, Nc, P]
                       mask_token.to(context.dtype).expand(b, n_tgt, -1)], dim=1)  # [B, Nc + Nt, P]
        ids = torch.cat([context_ids, target_ids], dim=1)  # [B, Nc + Nt]
        cos, sin = self._cos_sin(ids)  # [B, Nc + Nt, Dh]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for block in self.layer:
            x = block(x, cos, sin, full_attention)
        return self.proj(self.layernorm(x[:, n_ctx:]))  # [B, Nt, E]

    def _cos_sin(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row positions: cos/sin [B, N, Dh] for index rows ids [B, N]."""
        positions = index_positions(ids.reshape(-1), self.grid, self.grid)  # [3, B*N]
        cos, sin = self.rope.cos_sin(positions)  # [B*N, Dh]
        return cos.view(*ids.shape, -1), sin.view(*ids.shape, -1)  # [B, N, Dh]
