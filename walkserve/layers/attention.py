"""The model -> attention boundary.

Model code computes q, k, v (after rotary embedding and any q/k norm) and
hands them to an AttentionContext, which owns where keys and values live
(a paged KV pool, a dense cache, nothing) and how attention is computed.

    q: [T, Hq, Dh]   k, v: [T, Hkv, Dh]   ->   out: [T, Hq, Dh]

T is the number of tokens of the whole batch (ragged, no padding); the
context knows which tokens belong to which sequence and at which positions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F


class AttentionContext(ABC):
    """Per-forward attention state shared by every layer of one model call."""

    @abstractmethod
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Store this layer's k/v for the batch's tokens, attend, return [T, Hq, Dh]."""


class DenseAttention(AttentionContext):
    """No paging: attention over this call's tokens, plus an optional cached past per layer, under an explicit mask.

    The reference every cached or paged path is tested against, and the
    attention of model-level offline loops (encoders, joint passes).

        mask:  None     every query sees every key (bidirectional)
               "causal" query i sees keys up to past_len + i
               bool [Tq, Tk] (True = may attend), Tk = past_len + Tq
        past:  layer -> (k, v) [P, Hkv, Dh] keys/values that precede this call's (not written to)
        keep:  record each layer's keys/values (past + new) in ``self.kv`` for a later call

    A query row that may attend to nothing gets zeros, never NaN.
    """

    def __init__(self, mask: torch.Tensor | str | None = "causal",
                 past: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None, keep: bool = False):
        if isinstance(mask, str) and mask != "causal":
            raise ValueError(f"mask must be None, 'causal' or a bool tensor, got {mask!r}")
        self.mask, self.past, self.keep = mask, past or {}, keep
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        if layer in self.past:
            pk, pv = self.past[layer]
            k, v = torch.cat([pk.to(k.dtype), k]), torch.cat([pv.to(v.dtype), v])  # [P + T, Hkv, Dh]
        if self.keep:
            self.kv[layer] = (k, v)
        tq, tk = q.shape[0], k.shape[0]
        allowed = self.mask
        if isinstance(allowed, str):  # causal, aligned to the end of the keys
            allowed = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)
        if allowed is not None and tuple(allowed.shape) != (tq, tk):
            raise ValueError(f"mask of shape {tuple(allowed.shape)} does not match {tq} queries over {tk} keys")
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None].to(k.dtype),  # [1, Hq, Tq, Dh]
            k.transpose(0, 1)[None],  # [1, Hkv, Tk, Dh]
            v.transpose(0, 1)[None],
            attn_mask=None if allowed is None else allowed.to(q.device),
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )[0].transpose(0, 1)  # [Tq, Hq, Dh]
        if allowed is not None:  # rows that see no key: zeros (SDPA gives NaN there)
            out = out.masked_fill(~allowed.to(q.device).any(-1)[:, None, None], 0.0)
        return out.to(q.dtype)


class DenseCausalAttention(DenseAttention):
    """One sequence, no cache: plain causal attention over the tokens given. For tests and references."""

    def __init__(self) -> None:
        super().__init__("causal")


def block_causal_mask(frames: int, frame_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
    """bool [N, N], N = frames * frame_tokens: a token sees every token of its own and earlier frames."""
    frame = torch.arange(frames * frame_tokens, device=device) // frame_tokens  # [N]
    return frame[:, None] >= frame[None, :]


def block_diagonal_mask(lengths: list[int], device: torch.device | str | None = None) -> torch.Tensor:
    """bool [N, N], N = sum(lengths): packed sequences that attend only within themselves (varlen)."""
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    return seq[:, None] == seq[None, :]
