"""DenseContexts: a request's named contexts as dense per-layer K/V, running the layout's ops on the MoT LLM.

The reference for the engine's paged contexts: an ``Append`` attends over the
context's cache plus its own rows (causal text, full image blocks) and keeps
the keys and values; a ``Query`` attends the same way and keeps nothing; a
``Fork`` copies the layer dict (tensors are never written in place, so the
copy shares them); a ``Drop`` forgets the context.
"""

from __future__ import annotations

import torch

from walkserve.layers.attention import DenseAttention
from walkserve.models.bagel.layout import Append, Drop, Fork, Op, Segment
from walkserve.models.bagel.mot import MoTLM

KV = dict[int, tuple[torch.Tensor, torch.Tensor]]


class DenseContexts:
    def __init__(self, lm: MoTLM):
        self.lm = lm
        self.kv: dict[str, KV] = {}

    def cached(self, context: str) -> int:
        """Tokens cached in ``context`` (0 for one never written)."""
        layers = self.kv.get(context)
        return 0 if not layers else layers[0][0].shape[0]

    @torch.no_grad()
    def run(self, op: Op, image_rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """Run one op; appends and queries return the hidden states [n, D] of their rows.

        ``image_rows`` [N, D] fill the encoder rows of an image or latent segment.
        """
        if isinstance(op, Fork):
            self.kv[op.target] = dict(self.kv.get(op.source, {}))
            return None
        if isinstance(op, Drop):
            self.kv.pop(op.context, None)
            return None
        start = op.kv_start if isinstance(op, Append) else op.kv_len
        if self.cached(op.context) != start:
            raise AssertionError(f"{op.context}: the layout expects {start} cached tokens, the cache holds "
                                 f"{self.cached(op.context)}")
        keep = isinstance(op, Append)
        attn = DenseAttention("causal" if op.mask == "causal" else None, past=self.kv.get(op.context), keep=keep)
        ids, embeds, expert = self.rows(op.segment, image_rows)
        positions = torch.tensor(op.positions(), device=ids.device)
        hidden = self.lm(ids, positions, attn, inputs_embeds=embeds, expert=expert)  # [n, D]
        if keep:
            self.kv[op.context] = attn.kv
        return hidden

    def rows(self, segment: Segment, image_rows: torch.Tensor | None):
        """(ids [n], embeddings [n, D], expert [n]) of a segment, encoder rows spliced in."""
        device = self.lm.lm_head.weight.device
        ids = torch.tensor(segment.token_ids(), device=device)  # [n]
        embeds = self.lm.embed(ids)  # [n, D]
        if segment.image_tokens:
            if image_rows is None or image_rows.shape[0] != segment.image_tokens:
                raise ValueError(f"a {segment.kind} segment needs {segment.image_tokens} encoder rows")
            embeds = torch.cat([embeds[:1], image_rows.to(embeds.dtype), embeds[-1:]])
        return ids, embeds, torch.tensor(segment.expert(), device=device)
