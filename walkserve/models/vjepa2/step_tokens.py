"""The AC predictor's token layout: what one rollout step feeds the KV-cache component.

Step t is ``2 + F`` tokens (F = grid² frame tokens, 256 for the released model):

    row      0          1          2 … F+1
    kind     ACTION     STATE      FRAME (raster order)
    content  action_t   state_t    frame t's encoder tokens (layer-normed, width E)
    t, r, c  (t, 0, 0)  (t, 0, 0)  (t, row, col)

``inputs_embeds`` rows are E wide: a frame row holds its token; an action or
state row holds its 7 values in columns 0…6 and zeros elsewhere. The model
picks the input projection per row from ``token_kind`` (``predictor_embed``,
``action_encoder`` or ``state_encoder``). Positions are [3, T]; (t, 0, 0)
rotates only the depth part (angle 0 is the identity).

Attention is block-causal by step: a token sees every token of its own and
earlier steps. A cached step that appends exactly one step attends to the
whole cache and to itself with no mask at all.
"""

from __future__ import annotations

import torch

from walkserve.layers.attention import block_causal_mask
from walkserve.models.vjepa2.config import COND_TOKENS

ACTION, STATE, FRAME = 0, 1, 2


def step_kinds(steps: int, frame_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
    """LongTensor [steps * (2 + F)]: ACTION, STATE, then F x FRAME, per step."""
    one = torch.full((COND_TOKENS + frame_tokens,), FRAME, dtype=torch.long, device=device)
    one[0], one[1] = ACTION, STATE
    return one.repeat(steps)


def step_positions(first: int, steps: int, grid: int, device: torch.device | str | None = None) -> torch.Tensor:
    """LongTensor [3, steps * (2 + grid²)]: (t, row, col) of steps ``first`` … ``first + steps - 1``."""
    per_frame = grid * grid
    t = torch.arange(first, first + steps, device=device)[:, None].expand(steps, COND_TOKENS + per_frame)
    cell = torch.arange(per_frame, device=device)
    zeros = torch.zeros(COND_TOKENS, dtype=torch.long, device=device)
    rows = torch.cat([zeros, cell // grid])[None].expand(steps, -1)  # [S, 2 + F]
    cols = torch.cat([zeros, cell % grid])[None].expand(steps, -1)
    return torch.stack([t.reshape(-1), rows.reshape(-1), cols.reshape(-1)])  # [3, S * (2 + F)]


def step_rows(frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """inputs_embeds [S * (2 + F), E] from frames [S, F, E], actions [S, A] and states [S, A]."""
    s, _, e = frames.shape
    a = actions.shape[-1]
    cond = frames.new_zeros(s, COND_TOKENS, e)  # [S, 2, E]
    cond[:, 0, :a] = actions.to(frames.dtype)
    cond[:, 1, :a] = states.to(frames.dtype)
    return torch.cat([cond, frames], dim=1).reshape(-1, e)  # [S * (2 + F), E]


def step_mask(past_steps: int, new_steps: int, tokens_per_step: int,
              device: torch.device | str | None = None) -> torch.Tensor | None:
    """The block-causal mask [new * P, (past + new) * P] of appending ``new_steps`` after ``past_steps``.

    None (attend to everything) when exactly one step is appended: block-causal
    then allows every key.
    """
    if new_steps == 1:
        return None
    full = block_causal_mask(past_steps + new_steps, tokens_per_step, device=device)
    return full[past_steps * tokens_per_step :]
