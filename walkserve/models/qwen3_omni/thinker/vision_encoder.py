"""Qwen3-Omni vision encoder (``thinker.visual``, Qwen3-VL style) as a stateless component.

One image or video, as the processor lays it out: ``pixel_values`` [t*h*w, C*2*16*16],
patch rows in merge-block order (t, h/2, w/2, 2, 2), and ``grid_thw`` (t, h, w):

    Conv3d patch embedding (temporal 2 x 16 x 16, computed as one matmul)
      + learned position table [48 x 48] resampled bilinearly to the h x w grid
      -> blocks: x + attn(LN(x)) with 2-D rotary (row, col), attention within each frame;
                 x + MLP(LN(x))
         after blocks 8 / 16 / 24: deepstack merger j (LN over 4 merged patches, MLP -> thinker width)
      -> merger (LN per patch, 4 patches -> MLP -> thinker width): [t*h*w/4, out]

Outputs ``image_embeds`` [n, out] and ``deepstack`` [n, levels, out]: the
thinker adds ``deepstack[:, i]`` to its hidden state at these rows after its
decoder layer i. With ``visual_rows`` (bool [T], n of them true: the item's
rows in a thinker chunk that also holds text), ``deepstack`` comes out as
[T, levels, out], zero at the other rows (a per-token input of that chunk), and
``visual_embeds`` [T, out] likewise, when the firing asks for it (``prefill_media``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.engines.spec import Batch
from walkserve.layers.rope import apply_rotary
from walkserve.models.qwen3_omni.config import VisionEncoderConfig
from walkserve.models.qwen3_omni.thinker.windows import WindowLayout

PIXELS_SLOT = "pixel_values"  # float [t*h*w, patch_dim]
GRID_SLOT = "grid_thw"  # int64 [3]
OUTPUT_NAME = "image_embeds"  # [n_tokens, out_hidden_size]
DEEPSTACK_NAME = "deepstack"  # [n_tokens, levels, out_hidden_size], or [T, ...] with ROWS_SLOT
ROWS_SLOT = "visual_rows"  # optional bool [T]: where the n tokens sit in the thinker's chunk
AT_ROWS_NAME = "visual_embeds"  # [T, out_hidden_size]: the tokens at ROWS_SLOT, zero elsewhere


def block_order_coords(t: int, h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of every patch, in the processor's merge-block order, repeated for each of t frames."""
    rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)  # [h/m, m, w/m, m]
    cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
    rows, cols = rows.permute(0, 2, 1, 3).reshape(-1), cols.permute(0, 2, 1, 3).reshape(-1)  # [h*w] block order
    return rows.repeat(t), cols.repeat(t)


def bilinear_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """align_corners=True resampling of a ``side``-long table to ``size`` points: 2 taps [n, 2] and weights [n, 2]."""
    src = index.to(torch.float32) * (side - 1) / max(size - 1, 1)  # [n]
    floor = torch.floor(src)
    taps = floor.long()[:, None] + torch.arange(2)  # [n, 2]
    weights = (1 - (src[:, None] - taps.to(torch.float32)).abs()).clamp(min=0)  # [n, 2]
    return taps.clamp(0, side - 1), weights


class VisionAttention(nn.Module):
    """Fused qkv with bias, 2-D rotary on q and k, bidirectional attention within frames, proj."""

    def __init__(self, c: VisionEncoderConfig):
        super().__init__()
        self.num_heads, self.head_dim = c.num_heads, c.head_dim
        self.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.proj = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frames: WindowLayout) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)  # [N, H, Dh] each
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return self.proj(frames.attend(q, k, v, self.head_dim**-0.5).reshape(n, -1))  # [N, D]


class VisionMLP(nn.Module):
    def __init__(self, c: VisionEncoderConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(c.hidden_size, c.intermediate_size)
        self.linear_fc2 = nn.Linear(c.intermediate_size, c.hidden_size)
        self.approximate = "tanh" if c.hidden_act == "gelu_pytorch_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class VisionBlock(nn.Module):
    def __init__(self, c: VisionEncoderConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.attn = VisionAttention(c)
        self.mlp = VisionMLP(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frames: WindowLayout) -> torch.Tensor:
        h = x + self.attn(self.norm1(x), cos, sin, frames)  # [N, D]
        return h + self.mlp(self.norm2(h))  # [N, D]


class PatchMerger(nn.Module):
    """4 neighbouring patches -> one thinker token. ``after_merge``: LayerNorm over the 4 patches together
    (the deepstack mergers) instead of over each patch (the final merger)."""

    def __init__(self, c: VisionEncoderConfig, after_merge: bool):
        super().__init__()
        self.width = c.hidden_size * c.merge_unit
        self.after_merge = after_merge
        self.ln_q = nn.LayerNorm(self.width if after_merge else c.hidden_size, eps=1e-6)
        self.mlp = nn.ModuleList([nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, c.out_hidden_size)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_q(x.view(-1, self.width)) if self.after_merge else self.ln_q(x).view(-1, self.width)  # [N/4, 4D]
        for layer in self.mlp:
            x = layer(x)
        return x  # [N/4, out]


class PatchEmbed(nn.Module):
    def __init__(self, c: VisionEncoderConfig):
        super().__init__()
        kernel = (c.temporal_patch_size, c.patch_size, c.patch_size)
        self.proj = nn.Conv3d(c.in_channels, c.hidden_size, kernel_size=kernel, stride=kernel)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """patches [N, C*tp*p*p] -> [N, D]: a Conv3d whose stride equals its kernel is one matmul."""
        weight = self.proj.weight.reshape(self.proj.weight.shape[0], -1)  # [D, C*tp*p*p]
        return F.linear(patches.to(weight.dtype), weight, self.proj.bias)


class VisionEncoder(nn.Module):
    """Images / videos (flat patches + grid) -> merged tokens and deepstack features."""

    def __init__(self, config: VisionEncoderConfig):
        super().__init__()
        c = self.config = config
        self.patch_embed = PatchEmbed(c)
        self.pos_embed = nn.Embedding(c.num_position_embeddings, c.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(c) for _ in range(c.depth))
        self.merger = PatchMerger(c, after_merge=False)
        self.merger_list = nn.ModuleList(PatchMerger(c, after_merge=True) for _ in c.deepstack_visual_indexes)

    def forward(
        self, pixels: Sequence[torch.Tensor], grids: Sequence[Sequence[int]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Several items in one pass; for each, (tokens [n, out], deepstack [n, levels, out])."""
        grids = [tuple(int(v) for v in g) for g in grids]
        for p, (t, h, w) in zip(pixels, grids, strict=True):
            if p.shape[0] != t * h * w:
                raise ValueError(f"{p.shape[0]} patches do not fill a {t}x{h}x{w} grid")
        x = self.patch_embed(torch.cat(list(pixels)))  # [N, D]
        x = x + self._positions(grids).to(x.dtype)
        cos, sin = self._rotary(grids, x.device)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        frames = WindowLayout([h * w for t, h, w in grids for _ in range(t)], x.device)
        levels = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames)  # [N, D]
            if i in self.config.deepstack_visual_indexes:
                levels.append(self.merger_list[self.config.deepstack_visual_indexes.index(i)](x))  # [N/4, out]
        tokens = self.merger(x)  # [N/4, out]
        deepstack = torch.stack(levels, dim=1) if levels else tokens.new_zeros(tokens.shape[0], 0, tokens.shape[1])
        counts = [t * h * w // self.config.merge_unit for t, h, w in grids]
        return list(zip(tokens.split(counts), deepstack.split(counts), strict=True))

    def _positions(self, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """The learned [side x side] table resampled to each grid (bilinear, align_corners): [N, D]."""
        side = math.isqrt(self.config.num_position_embeddings)
        out = []
        for t, h, w in grids:
            rows, cols = block_order_coords(t, h, w, self.config.spatial_merge_size)
            (rt, rw), (ct, cw) = bilinear_taps(rows, h, side), bilinear_taps(cols, w, side)
            index = (rt[:, :, None] * side + ct[:, None, :]).reshape(-1, 4)  # [n, 4] taps
            weight = (rw[:, :, None] * cw[:, None, :]).reshape(-1, 4)  # [n, 4]
            table = self.pos_embed(index.to(self.pos_embed.weight.device))  # [n, 4, D]
            out.append((table * weight.to(table.device, table.dtype)[:, :, None]).sum(1))
        return torch.cat(out)

    def _rotary(self, grids: list[tuple[int, int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, Dh/2] float32: the first Dh/4 frequencies turn with the row, the next Dh/4 with the column."""
        spatial = self.config.head_dim // 2  # each axis gets spatial / 2 frequencies
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
        coords = [block_order_coords(t, h, w, self.config.spatial_merge_size) for t, h, w in grids]
        rows = torch.cat([r for r, _ in coords]).float()
        cols = torch.cat([c for _, c in coords]).float()
        angles = torch.cat([rows[:, None] * inv_freq, cols[:, None] * inv_freq], dim=1).to(device)  # [N, Dh/2]
        return angles.cos(), angles.sin()

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        """The stateless-engine entry: each item holds ``pixel_values`` [t*h*w, patch_dim] and ``grid_thw`` [3]."""
        inputs = [item.inputs for item in batch]
        device = self.pos_embed.weight.device
        pixels = [torch.as_tensor(i[PIXELS_SLOT], device=device) for i in inputs]
        grids = [torch.as_tensor(i[GRID_SLOT]).reshape(3).tolist() for i in inputs]
        with torch.inference_mode():
            out = self(pixels, grids)
            return [_outputs(tokens, deep, i.get(ROWS_SLOT), item.outputs or None)
                    for (tokens, deep), i, item in zip(out, inputs, batch, strict=True)]


def _outputs(tokens: torch.Tensor, deepstack: torch.Tensor, rows: Any, wanted: Sequence[str] | None) -> dict:
    """One item's outputs: those the graph reads (``wanted``), or all of them for a direct caller."""
    out = {OUTPUT_NAME: tokens, DEEPSTACK_NAME: _at_rows(deepstack, rows)}
    if rows is not None and (wanted is None or AT_ROWS_NAME in wanted):
        out[AT_ROWS_NAME] = _at_rows(tokens, rows)
    return out if wanted is None else {name: out[name] for name in wanted}


def _at_rows(x: torch.Tensor, rows: Any) -> torch.Tensor:
    """x [n, ...] scattered to the true rows of ``rows`` (bool [T]): [T, ...], zero elsewhere; as is without rows."""
    if rows is None:
        return x
    mask = torch.as_tensor(rows, device=x.device).reshape(-1).to(torch.bool)  # [T]
    if int(mask.sum()) != x.shape[0]:
        raise ValueError(f"{ROWS_SLOT!r} marks {int(mask.sum())} rows for {x.shape[0]} visual tokens")
    out = x.new_zeros(mask.shape[0], *x.shape[1:])  # [T, ...]
    out[mask] = x
    return out
