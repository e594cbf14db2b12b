"""Code2WavStream: the streamed vocoder of Qwen3-Omni (a stateless-engine component).

Input slot ``codes``: the chunk's frames, int64 ``[n, 16]`` (item k of the
stream is frame k: code 0 from the talker, codes 1..15 from the code
predictor), streamed with ``LeftContext(25, 25)`` (``POLICY``);
``item.spans["codes"]`` says which frames are context. Output ``audio``:
float32 ``[samples]`` at 24 kHz.

Emission (``code2wav_geometry.plan_chunk``): a chunk with new frames [a, b)
decodes its whole span and keeps global samples [1920 a - 555, 1920 b - 555)
(from 0 for the first chunk). Each sample is emitted once, by the first chunk
whose decode has it final, so the concatenated stream equals one decode of
all frames (1920 F - 555 samples), with 1920 samples per frame after the
first chunk and the whole stream 555 samples (23 ms) behind the frames.

Exactness: equal to the whole decode when the left context covers the
receptive field (``Code2WavGeometry.exact_context``: 10 frames of convolutions
plus layers x (window - 1) of attention). The release's pre-transformer
reaches 568 frames, so with 25 frames of context the stream approximates the
whole decode there (as every streaming implementation of this model does).

Firings with the same number of frames and the same kept range are decoded
as one batch (rows are independent).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from walkserve.engines.spec import Batch, Item
from walkserve.models.qwen3_omni.speech.code2wav import Code2Wav
from walkserve.models.qwen3_omni.speech.code2wav_geometry import ChunkPlan, plan_chunk
from walkserve.streaming.policy import LeftContext

INPUT_SLOT, OUTPUT_NAME = "codes", "audio"
CHUNK_FRAMES, CONTEXT_FRAMES = 25, 25
POLICY = LeftContext(CHUNK_FRAMES, CONTEXT_FRAMES)


class Code2WavStream:
    """Turns LeftContext chunks of codec frames into the waveform samples they finalise."""

    def __init__(self, vocoder: Code2Wav):
        self.vocoder = vocoder
        self.geometry = vocoder.geometry
        self.groups = vocoder.config.num_quantizers

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        """One ``{"audio": float32 [samples]}`` per firing, in order."""
        items = list(batch)
        plans = [plan_chunk(f.spans[INPUT_SLOT], self.geometry) for f in items]
        codes = [self._codes(f) for f in items]
        device = self.vocoder.code_embedding.weight.device
        audio = [torch.zeros(0, device=device) for _ in items]
        groups: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for k, plan in enumerate(plans):
            if plan.n_samples:
                groups[(plan.n_frames, plan.keep_lo, plan.keep_hi)].append(k)
        for rows in groups.values():
            for k, wave in zip(rows, self.decode([codes[k] for k in rows], plans[rows[0]])):
                audio[k] = wave
        return [{OUTPUT_NAME: a} for a in audio]

    @torch.no_grad()
    def decode(self, chunks: list[torch.Tensor], plan: ChunkPlan) -> list[torch.Tensor]:
        """Decode equal-length chunks [n, 16] as one batch; each row's kept samples, float32 [n_samples]."""
        device = self.vocoder.code_embedding.weight.device
        batch = torch.stack(chunks).to(device).transpose(1, 2)  # [B, 16, n]
        wave = self.vocoder(batch)[:, 0, plan.keep_lo : plan.keep_hi].float()  # [B, n_samples]
        return [wave[row].clone() for row in range(wave.shape[0])]  # each output owns its memory

    def _codes(self, item: Item) -> torch.Tensor:
        codes = torch.as_tensor(item.inputs[INPUT_SLOT], dtype=torch.int64)
        span = item.spans[INPUT_SLOT]
        codes = codes.reshape(-1, self.groups) if codes.numel() else codes.reshape(0, self.groups)  # [n, 16]
        if codes.shape[0] != span.n_items:
            raise ValueError(f"Code2Wav: chunk {span.index} of {item.request_id} holds {codes.shape[0]} frames "
                             f"but its span covers {span.n_items}")
        size = self.vocoder.config.codebook_size
        if codes.numel() and not (int(codes.min()) >= 0 and int(codes.max()) < size):
            raise ValueError(f"Code2Wav: chunk {span.index} of {item.request_id} holds a code outside "
                             f"0..{size - 1}")
        return codes
