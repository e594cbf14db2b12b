"""WindowLayout: attention restricted to windows of a packed token sequence, as one padded SDPA call.

The audio encoder attends inside windows of 104 tokens and the vision
encoder inside each frame; both pack the tokens of several items in one
sequence. Rather than a [N, N] block-diagonal mask (quadratic in the whole
batch) the tokens are scattered into a [W, Lmax] grid, one row per window:

    tokens  a a a b b c c c c        windows: 3, 2, 4 tokens
    grid    a a a .                  key mask hides the empty slots
            b b . .
            c c c c
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


class WindowLayout:
    """``lengths``: the windows' token counts, in token order (plain ints, known from the inputs' shapes)."""

    def __init__(self, lengths: Sequence[int], device: torch.device):
        self.lengths = [int(n) for n in lengths]
        if not self.lengths or min(self.lengths) <= 0:
            raise ValueError(f"window lengths must be positive, got {self.lengths}")
        self.width = max(self.lengths)
        lens = torch.tensor(self.lengths, device=device)  # [W]
        slots = torch.arange(self.width, device=device)  # [Lmax]
        self.valid = slots[None, :] < lens[:, None]  # [W, Lmax]
        self.index = self.valid.reshape(-1).nonzero().squeeze(1)  # [N] grid slot of each token

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q, k, v [N, H, Dh] -> [N, H, Dh], each token attending (bidirectionally) to its own window."""
        w, n_slots = len(self.lengths), len(self.lengths) * self.width
        if len(self.lengths) == 1:  # one window: no padding, no mask
            out = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), scale=scale)
            return out[0].transpose(0, 1)  # [N, H, Dh]
        grid = [
            t.new_zeros(n_slots, *t.shape[1:]).index_copy_(0, self.index, t).view(w, self.width, *t.shape[1:])
            .transpose(1, 2)
            for t in (q, k, v)
        ]  # [W, H, Lmax, Dh] each
        out = F.scaled_dot_product_attention(*grid, attn_mask=self.valid[:, None, None, :], scale=scale)
        return out.transpose(1, 2).reshape(n_slots, *q.shape[1:])[self.index]  # [N, H, Dh]
