"""SigLIP vision transformer over packed patches: images of any size, one sequence each (NaViT-style).

    pixels [C, H, W] --patchify--> patches [h*w, C*P*P]   (channel, row, col) order
    patches [N, C*P*P] of several images, concatenated  (lengths[i] patches for image i)
        -> patch_embedding + position_embedding[position_ids]
        -> L x (x + attn(ln1(x)); x + mlp(ln2(x)))       attention only within each image
        -> post_layernorm -> [N, D]

``position_ids`` index the learned table: ``row * patches_per_side + col``
for a patch at (row, col), so a square image of ``image_size`` uses
0 .. num_positions - 1 (``grid_position_ids``) and a smaller or non-square
one a subset (BAGEL's NaViT). Parameter names are the HF ``SiglipVisionModel``'s
under its ``vision_model.`` prefix (the pooling ``head`` is not used).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.linear import FusedLinear, Linear
from walkserve.models.siglip.config import SiglipVisionConfig


def patchify(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """pixels [C, H, W] (H, W multiples of ``patch``) -> [h*w, C*patch*patch], rows in raster order."""
    c, height, width = pixels.shape
    h, w = height // patch, width // patch
    x = pixels.reshape(c, h, patch, w, patch)  # [C, h, P, w, P]
    return x.permute(1, 3, 0, 2, 4).reshape(h * w, c * patch * patch)  # [h*w, C*P*P]


def grid_position_ids(h: int, w: int, side: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Position ids [h*w] of an h x w patch grid in a table of ``side`` x ``side``: row * side + col."""
    rows = torch.arange(h, device=device)[:, None] * side
    return (rows + torch.arange(w, device=device)[None, :]).reshape(-1)


class PatchEmbedding(nn.Module):
    """The HF Conv2d(C, D, P, stride P) applied to flattened patches: weight [D, C, P, P], bias [D]."""

    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        p = config.patch_size
        self.weight = nn.Parameter(torch.empty(config.hidden_size, config.num_channels, p, p))
        self.bias = nn.Parameter(torch.empty(config.hidden_size))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return F.linear(patches.to(self.weight.dtype), self.weight.reshape(self.weight.shape[0], -1), self.bias)


class Embeddings(nn.Module):
    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.patch_embedding = PatchEmbedding(config)
        self.position_embedding = nn.Embedding(config.num_positions, config.hidden_size)

    def forward(self, patches: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.patch_embedding(patches) + self.position_embedding(position_ids)  # [N, D]


class Attention(nn.Module):
    """Bidirectional multi-head attention within each packed image."""

    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        d = config.hidden_size
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.qkv_proj = FusedLinear(d, [("q_proj", d), ("k_proj", d), ("v_proj", d)], bias=True)
        self.out_proj = Linear(d, d, bias=True)

    def forward(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = (t.view(n, self.num_heads, self.head_dim) for t in self.qkv_proj.split(self.qkv_proj(x)))
        return self.out_proj(_varlen_attention(q, k, v, lengths).reshape(n, -1))  # [N, D]


def _varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Full attention of q, k, v [N, H, Dh] within consecutive segments of ``lengths``; images of one
    length run as one batched call."""
    out = torch.empty_like(q)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(n, []).append(i)
    for n, images in by_length.items():
        rows = torch.cat([torch.arange(starts[i], starts[i] + n, device=q.device) for i in images])  # [B*n]
        b = len(images)
        qb, kb, vb = (t[rows].view(b, n, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))  # [B, H, n, Dh]
        out[rows] = F.scaled_dot_product_attention(qb, kb, vb).transpose(1, 2).reshape(b * n, *q.shape[1:])
    return out


class MLP(nn.Module):
    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.fc1 = Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.fc2 = Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.approximate = "tanh" if config.hidden_act == "gelu_pytorch_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class EncoderLayer(nn.Module):
    """Pre-norm block: x + attn(ln1(x)), then h + mlp(ln2(h))."""

    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = Attention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        h = x + self.self_attn(self.layer_norm1(x), lengths)  # [N, D]
        return h + self.mlp(self.layer_norm2(h))  # [N, D]


class Encoder(nn.Module):
    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))


class SiglipVisionTower(nn.Module):
    """The tower without the pooling head. Load with the checkpoint prefix that holds ``embeddings.``
    (none for a SiglipVisionModel saved by transformers 5, ``vision_model.`` in older exports)."""

    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, patches: torch.Tensor, position_ids: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """patches [N, C*P*P] of len(lengths) images (sum(lengths) == N), position_ids [N] -> [N, D]."""
        if sum(lengths) != patches.shape[0] or position_ids.shape != patches.shape[:1]:
            raise ValueError(f"{patches.shape[0]} patches, {position_ids.numel()} position ids, lengths sum {sum(lengths)}")
        x = self.embeddings(patches, position_ids)  # [N, D]
        for layer in self.encoder.layers:
            x = layer(x, lengths)
        return self.post_layernorm(x)  # [N, D]

    def forward_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, C, H, W] of one size -> [B, h*w, D] (a square ``image_size`` input is HF's
        ``SiglipVisionModel(...).last_hidden_state``)."""
        b, _, height, width = pixels.shape
        p, side = self.config.patch_size, self.config.patches_per_side
        patches = torch.cat([patchify(img, p) for img in pixels])  # [B*h*w, C*P*P]
        n = (height // p) * (width // p)
        positions = grid_position_ids(height // p, width // p, side, pixels.device).repeat(b)  # [B*n]
        return self.forward(patches, positions, [n] * b).view(b, n, -1)
