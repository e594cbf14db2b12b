"""The prefix of a pi0 / pi0.5 request: embeddings, positions and which tokens are valid.

Two layouts give the same K/V for every valid token:

    padded (openpi, lerobot; the references)   compact (the serving path)
    [cam0 P | cam1 P | cam2 P | prompt L]       [present cams' P each | prompt ids, unpadded]
    absent cameras and padding: valid=False     only valid tokens
    positions = cumsum(valid) - 1                positions = 0 .. n-1
    mask = valid_i & valid_j  (bidirectional)   mask = full

``openpi_mask`` is big_vision's ``make_attn_mask``, the mask of openpi's
joint passes: token i sees token j when both are valid and
cumsum(ar)[j] <= cumsum(ar)[i] (ar = 1 starts a block that earlier tokens
cannot see). The prefix is one block (ar = 0 everywhere); pi0.5's suffix
opens one more block ([1, 0, ..., 0]); pi0's suffix opens two (its state
token, then the actions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from walkserve.models.pi0.prefix_lm import PaliGemmaLM


@dataclass(frozen=True)
class PrefixInputs:
    embeds: torch.Tensor  # [T, D]
    positions: torch.Tensor  # [T] long
    valid: torch.Tensor  # [T] bool

    @property
    def num_valid(self) -> int:
        return int(self.valid.sum())

    @property
    def all_valid(self) -> bool:
        return bool(self.valid.all())


def openpi_mask(valid: torch.Tensor, ar: torch.Tensor) -> torch.Tensor:
    """bool [T, T] from valid [T] (bool) and ar [T] (0/1)."""
    block = torch.cumsum(ar.long(), 0)  # [T]
    return (block[None, :] <= block[:, None]) & valid[None, :] & valid[:, None]


def prefix_positions(valid: torch.Tensor) -> torch.Tensor:
    """cumsum(valid) - 1: invalid tokens take no position of their own."""
    return torch.cumsum(valid.long(), 0) - 1


def compact_prefix(lm: PaliGemmaLM, image_embeds: torch.Tensor, token_ids: torch.Tensor) -> PrefixInputs:
    """Serving layout: image tokens of the present cameras [n*P, D], then the prompt ids [L] (unpadded)."""
    embeds = torch.cat([image_embeds.to(lm.embed_tokens.weight.dtype), lm.embed(token_ids)])  # [T, D]
    t = embeds.shape[0]
    return PrefixInputs(embeds, torch.arange(t, device=embeds.device),
                        torch.ones(t, dtype=torch.bool, device=embeds.device))


def padded_prefix(lm: PaliGemmaLM, cameras: list[torch.Tensor | None], tokens_per_image: int,
                  token_ids: torch.Tensor, token_valid: torch.Tensor) -> PrefixInputs:
    """openpi's layout: every camera slot (None = absent: masked zeros), then the padded prompt."""
    width = lm.config.hidden_size
    dtype, device = lm.embed_tokens.weight.dtype, lm.embed_tokens.weight.device
    parts, valid = [], []
    for image in cameras:
        present = image is not None
        parts.append(image.to(dtype) if present else torch.zeros(tokens_per_image, width, dtype=dtype, device=device))
        valid.append(torch.full((tokens_per_image,), present, dtype=torch.bool, device=device))
    parts.append(lm.embed(token_ids))
    valid.append(token_valid.to(device))
    mask = torch.cat(valid)  # [T]
    return PrefixInputs(torch.cat(parts), prefix_positions(mask), mask)
