"""The masked predictor as a stateless-engine component (the ``predict`` task).

Input slots: ``features`` float [N, E] (the encoder's output for a clip of
exactly crop_size² frames), ``context_ids`` and ``target_ids`` int64 [Nc], [Nt]
(raster token indices). Output ``predicted``: [Nt, E] in ``target_ids``
order, float32 unless the request's ``dtype`` param asks for float16 /
bfloat16. Firings with the same (Nc, Nt) run as one batch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from walkserve.engines.spec import Batch
from walkserve.models.vjepa2.masked_predictor import MaskedPredictor
from walkserve.models.vjepa2.params import run_params
from walkserve.models.vjepa2.stepper import output_dtype

OUTPUT_NAME = "predicted"


class PredictorComponent:
    """Context features and token indices in, predicted target features out."""

    def __init__(self, predictor: MaskedPredictor):
        self.predictor = predictor

    @torch.inference_mode()
    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        """One ``{"predicted": [Nt, E]}`` per item, in order."""
        device = self.predictor.proj.weight.device
        items = []
        for f in batch:
            inputs = f.inputs
            ctx = torch.as_tensor(inputs["context_ids"], dtype=torch.long, device=device)
            tgt = torch.as_tensor(inputs["target_ids"], dtype=torch.long, device=device)
            feats = torch.as_tensor(inputs["features"], device=device)
            items.append((feats[ctx], ctx, tgt))  # context features [Nc, E]
        out: list[Any] = [None] * len(items)
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, (_, ctx, tgt) in enumerate(items):
            groups[(ctx.numel(), tgt.numel())].append(i)
        for rows in groups.values():
            feats, ctx, tgt = (torch.stack([items[i][j] for i in rows]) for j in range(3))
            predicted = self.predictor(feats, ctx, tgt)  # [B, Nt, E]
            for i, p in zip(rows, predicted):
                out[i] = {OUTPUT_NAME: p.float().to(output_dtype(run_params(batch.items[i].params)))}
        return out
