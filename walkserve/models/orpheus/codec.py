"""OrpheusCodec: the SNAC stream consumer of Orpheus TTS (a stateless-engine component).

Input slot ``codes``: the chunk's audio token ids, int64 ``[n]`` (the LM's
generated audio tokens, END_OF_SPEECH never included), streamed with
``SlidingWindow(28, 7)``; ``item.spans["codes"]`` says which part of the stream
it is. Output ``audio``: float32 ``[samples]`` at 24 kHz, on the decoder's
device. Which samples each firing emits, and how its noise is seeded, is
written down in ``emission.py``: over a whole stream the outputs concatenate
to exactly (complete frames) * 2048 samples, each frame once.

Firings whose windows have the same number of frames and emit the same frames
are decoded as one SNAC batch, computing only the emitted samples; each row
has its own generator and the decoder's kernels are batch-invariant, so
batching never changes a request's samples. Noise generators live on the CPU
(the same noise on every device).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from walkserve.core.errors import ConfigError
from walkserve.engines.spec import Batch, Item
from walkserve.models.orpheus.emission import WindowPlan, plan_window, request_seed, window_seed
from walkserve.models.orpheus.tokens import (
    CODEBOOK_SIZE,
    FRAME_SAMPLES,
    AudioTokenError,
    frames_to_codes,
)
from walkserve.models.snac.decoder import SnacDecoder
from walkserve.models.snac.weights import load_snac

INPUT_SLOT = "codes"
OUTPUT_NAME = "audio"
SNAC_STRIDES = (4, 2, 1)


class OrpheusCodec:
    """Turns windows of Orpheus audio tokens into waveform samples with a SNAC 24 kHz decoder."""

    def __init__(self, decoder: SnacDecoder):
        cfg = decoder.cfg
        if (
            cfg.vq_strides != SNAC_STRIDES
            or cfg.codebook_size != CODEBOOK_SIZE
            or cfg.frame_samples != FRAME_SAMPLES
        ):
            raise ConfigError(
                f"Orpheus needs a SNAC codec with vq_strides {list(SNAC_STRIDES)}, codebook_size {CODEBOOK_SIZE} "
                f"and {FRAME_SAMPLES} samples per frame; got {list(cfg.vq_strides)}, {cfg.codebook_size}, "
                f"{cfg.frame_samples}"
            )
        self.decoder = decoder

    @classmethod
    def from_dir(
        cls, snac_path: str | Path, device: str = "cpu", dtype: str = "float32"
    ) -> OrpheusCodec:
        """Load the SNAC checkpoint directory (config.json + model.safetensors)."""
        return cls(load_snac(snac_path, device=device, dtype=dtype))

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        """One ``{"audio": float32 [samples]}`` per firing, in order.

        Raises AudioTokenError (naming the request) when a window holds a token
        that is not an audio code for its stream position.
        """
        items = list(batch)
        plans = [plan_window(f.spans[INPUT_SLOT]) for f in items]
        codes = [self._codes(f, p) for f, p in zip(items, plans)]
        device = self.decoder.out_conv.weight.device
        audio = [torch.zeros(0, device=device) for _ in items]
        groups: dict[tuple[int, tuple[int, int]], list[int]] = defaultdict(list)
        for k, plan in enumerate(plans):
            if plan.n_frames:
                groups[(plan.n_frames, plan.sample_range(FRAME_SAMPLES))].append(k)
        for rows in groups.values():
            samples = self._decode(
                [codes[k] for k in rows], [items[k] for k in rows], [plans[k] for k in rows]
            )
            for k, a in zip(rows, samples):
                audio[k] = a
        return [{OUTPUT_NAME: a} for a in audio]

    def _codes(self, item: Item, plan: WindowPlan) -> list[torch.Tensor]:
        ids = torch.as_tensor(item.inputs[INPUT_SLOT], dtype=torch.int64).reshape(-1)  # ids: [n]
        span = item.spans[INPUT_SLOT]
        if ids.numel() != span.n_items:
            raise ValueError(
                f"Orpheus codec: chunk {span.index} of {item.request_id} holds {ids.numel()} "
                f"tokens but its span covers {span.n_items}"
            )
        try:
            return frames_to_codes(ids[: plan.n_tokens].cpu(), plan.token_start)
        except AudioTokenError as e:
            raise AudioTokenError(f"request {item.request_id}: {e}") from None

    def _decode(
        self, codes: list[list[torch.Tensor]], items: list[Item], plans: list[WindowPlan]
    ) -> list[torch.Tensor]:
        """Decode windows of equal length and emitted range as one batch; return each one's samples.

        Only the emitted samples are computed (``SnacDecoder.decode(keep=...)``):
        a regular window keeps one of its four frames.
        """
        levels = [
            torch.stack([c[level] for c in codes]) for level in range(len(SNAC_STRIDES))
        ]  # [B, n_level]
        gens = [self._generator(f, p) for f, p in zip(items, plans)]
        keep = plans[0].sample_range(FRAME_SAMPLES)
        wave = self.decoder.decode(levels, gens, keep=keep)[:, 0].float()  # wave: [B, emitted samples]
        # clone: each output owns its memory instead of pinning the whole batch
        return [wave[row].clone() for row in range(len(plans))]

    @staticmethod
    def _generator(item: Item, plan: WindowPlan) -> torch.Generator:
        seed = item.sampling.seed if item.sampling is not None else None
        base = request_seed(item.request_id, seed)
        return torch.Generator().manual_seed(window_seed(base, plan.token_start))
