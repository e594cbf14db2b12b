"""The speech components as the engines drive them: the talker's row builder, and the three small glue nodes.

    TalkerLM (KV engine, context "talker"): rows of token inputs -> talker inputs -> hidden -> code-0 logits
        text  int64 [T]      thinker ids; text part = text_projection(thinker embedding)
        media float [T, Dt]  (media rows only) text part = hidden_projection(accept-layer state) instead
        codes int64 [T, 16]  codec part = talker.embed(code 0) + sum_g predictor E[g-1](code g); -1: absent
        the ``tokens`` slot holds code 0 (codec_pad where absent): the sampler's repetition history
    TalkerGlue (stateless), one node each per frame of ``talker_decode``:
        predictor_in  code0 [1], hidden [1, D] -> tokens [2], embeds [2, D] = [hidden, talker.embed(code0)]
        frame         code0 [1], first [1], rest [14] (stacked predictor ids) -> frame int64 [1, 16]
        talker_in     frame [1, 16], text chunk [0 or 1] -> the talker's next row; stop when code 0 is EOS

The sums follow transformers' order (codec part summed group by group, then
the text part added), so greedy codes match it exactly.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from walkserve.engines.spec import Batch, Item
from walkserve.layers.attention import AttentionContext
from walkserve.models.common.checkpoint import SafetensorsCheckpoint
from walkserve.models.qwen3_omni.speech.code_predictor import StackedEmbedding
from walkserve.models.qwen3_omni.speech.config import SpeechConfig
from walkserve.models.qwen3_omni.speech.graph import FRAME, PREDICTOR_IN, TALKER_IN
from walkserve.models.qwen3_omni.speech.talker import Talker


class TalkerLM(nn.Module):
    """The talker with the tables its inputs need: the thinker's embeddings and the predictor's 15 code tables."""

    def __init__(self, talker: Talker, thinker_embed: nn.Embedding, residual_embed: StackedEmbedding):
        super().__init__()
        self.talker = talker
        self.config = talker.config
        self.thinker_embed = thinker_embed
        self.residual_embed = residual_embed
        self.book = residual_embed.size

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.talker.embed(input_ids)  # [T, D] code-0 embeddings (the engine's default; unused here)

    def codec_part(self, codes: torch.Tensor) -> torch.Tensor:
        """codes int64 [T, G] (-1 absent) -> [T, D]: code 0 through the talker's table, code g through E[g-1]."""
        present = (codes >= 0).to(self.talker.model.codec_embedding.weight.dtype)  # [T, G]
        part = self.talker.embed(codes[:, 0].clamp_min(0)) * present[:, :1]  # [T, D]
        for g in range(1, codes.shape[1]):
            ids = codes[:, g].clamp_min(0) + (g - 1) * self.book
            part = part + self.residual_embed(ids) * present[:, g : g + 1]  # [T, D]
        return part

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, attn: AttentionContext,
                inputs_embeds: torch.Tensor | None = None, text: torch.Tensor | None = None,
                codes: torch.Tensor | None = None, media: torch.Tensor | None = None) -> torch.Tensor:
        """Final-norm hidden states [T, D] of rows given as token inputs (module docstring)."""
        if media is not None:
            text_part = self.talker.project_hidden(media.to(self.talker.hidden_projection.linear_fc1.weight.dtype))
        else:
            text_part = self.talker.project_text(self.thinker_embed(text))  # [T, D]
        x = self.codec_part(codes) + text_part  # [T, D]
        return self.talker.model(x, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.talker.compute_logits(hidden)  # [N, V] float32


class TalkerGlue(nn.Module):
    """The per-frame bookkeeping of ``talker_decode`` (three node kinds, module docstring)."""

    def __init__(self, config: SpeechConfig, codec_embedding: nn.Embedding):
        super().__init__()
        self.codec_embedding = codec_embedding
        t = config.tokens
        self.codec_eos, self.tts_eos, self.tts_pad = t.codec_eos, t.tts_eos, t.tts_pad
        self.book = config.code_predictor.codebook_size

    @torch.no_grad()
    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        kind = batch.op if batch.op in (PREDICTOR_IN, FRAME, TALKER_IN) else batch.node
        return [self._one(kind, f) for f in batch]

    def _one(self, kind: str, f: Item) -> dict[str, torch.Tensor]:
        if kind == PREDICTOR_IN:
            return self._predictor_in(f)
        if kind == FRAME:
            return self._frame(f)
        return self._talker_in(f)

    def _predictor_in(self, f: Item) -> dict[str, torch.Tensor]:
        code0 = _ids(f.inputs["code0"])  # [1]
        weight = self.codec_embedding.weight
        hidden = torch.as_tensor(f.inputs["hidden"]).reshape(1, -1).to(weight.device, weight.dtype)  # [1, D]
        embeds = torch.cat([hidden, self.codec_embedding(code0.to(weight.device))])  # [2, D]
        return {"tokens": torch.zeros(2, dtype=torch.long), "embeds": embeds}

    def _frame(self, f: Item) -> dict[str, torch.Tensor]:
        code0, first, rest = _ids(f.inputs["code0"]), _ids(f.inputs["first"]), _ids(f.inputs["rest"])
        frame = torch.cat([code0, first % self.book, rest % self.book])  # [16]
        return {"frame": frame[None]}  # [1, 16]

    def _talker_in(self, f: Item) -> dict[str, torch.Tensor]:
        frame = _ids(f.inputs["frame"]).reshape(1, -1)  # [1, 16]
        chunk, span = _ids(f.inputs["text"]), f.spans["text"]
        if chunk.numel():
            text = chunk[:1]
        else:  # the thinker has ended: tts_eos at the first step past its last token, then tts_pad
            text = torch.tensor([self.tts_eos if span.index == span.start else self.tts_pad])
        stop = torch.tensor([int(frame[0, 0]) == self.codec_eos])
        return {"tokens": frame[:, 0].clone(), "text": text, "codes": frame, "stop": stop}


def _ids(value) -> torch.Tensor:
    return torch.as_tensor(value).reshape(-1).to(torch.long).cpu()


def thinker_embedding(path: str | Path, device, dtype: torch.dtype) -> nn.Embedding:
    """The thinker's input embedding table (``thinker.model.embed_tokens``), which the talker's text part reads."""
    from safetensors import safe_open

    from walkserve.models.qwen3_omni.speech.weights import THINKER_EMBED

    files = SafetensorsCheckpoint(path).files
    with safe_open(files[THINKER_EMBED], framework="pt", device="cpu") as f:
        table = f.get_tensor(THINKER_EMBED)
    return nn.Embedding.from_pretrained(table.to(device, dtype))  # frozen, and no random init first
