"""Qwen3-Omni audio encoder (``thinker.audio_tower``) as a stateless component.

One clip, mel [128, F] at 16 kHz, 10 ms per frame:

    chunks of 100 frames (the last one shorter, zero-padded to the clip's longest chunk)
      -> 3 x (Conv2d 3x3 stride 2, GELU): [n, 1, 128, 100] -> [n, C, 16, 13]
      -> conv_out (C*16 -> d, no bias) + sinusoidal position 0..12 (restarts in every chunk)
      -> keep each chunk's valid tokens: 13 per full chunk, conv_length(r) for the last
      -> L x pre-LN transformer layers; attention only inside windows of
         13 * n_window_infer / 100 tokens (104 for the release)
      -> ln_post -> proj1 -> GELU -> proj2: [n_tokens, output_dim]

Chunks are padded per clip, so a clip's tokens never depend on what it is
batched with. The reference pads every chunk of one call to the call's longest
chunk; the two agree whenever the clip has at least one full chunk (1 s) or is
encoded alone (the processor's one clip per item). The attention windows are
encoded as separate items of one packed sequence, and recently encoded windows
are taken from a cache keyed by the chained digest of the clip's features up
to that window (``content_keys.audio_window_keys``): a clip that grew while it
arrived is encoded again only from its first changed window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.engines.spec import Batch
from walkserve.models.common.feature_cache import FeatureCache
from walkserve.models.qwen3_omni.config import AudioEncoderConfig
from walkserve.models.qwen3_omni.thinker.content_keys import audio_window_keys
from walkserve.models.qwen3_omni.thinker.media_tokens import audio_chunk_lengths, conv_length
from walkserve.models.qwen3_omni.thinker.windows import WindowLayout

INPUT_SLOT = "mel"  # float [num_mel_bins, F]
OUTPUT_NAME = "audio_embeds"  # [n_tokens, output_dim]
WINDOW_CACHE = 64  # encoded windows kept (the release: 104 x 2048 values each, 27 MB in bf16 for 64)


def sinusoid_positions(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """[length, channels] float32: sin of position x timescale on the first half, cos on the second."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2).float())  # [C/2]
    scaled = torch.arange(length)[:, None] * inv_timescales[None, :]  # [length, C/2]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


class AudioAttention(nn.Module):
    """Bidirectional multi-head attention inside windows; q/k/v/out projections with biases."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, windows: WindowLayout) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = (proj(x).view(n, self.num_heads, self.head_dim) for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = windows.attend(q, k, v, self.head_dim**-0.5)  # [N, H, Dh]
        return self.out_proj(out.reshape(n, -1))  # [N, d]


class AudioEncoderLayer(nn.Module):
    """x + attn(LN(x)), then h + fc2(GELU(fc1(LN(h))))."""

    def __init__(self, c: AudioEncoderConfig):
        super().__init__()
        self.self_attn = AudioAttention(c.d_model, c.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(c.d_model)
        self.fc1 = nn.Linear(c.d_model, c.encoder_ffn_dim)
        self.fc2 = nn.Linear(c.encoder_ffn_dim, c.d_model)
        self.final_layer_norm = nn.LayerNorm(c.d_model)

    def forward(self, x: torch.Tensor, windows: WindowLayout) -> torch.Tensor:
        h = x + self.self_attn(self.self_attn_layer_norm(x), windows)  # [N, d]
        return h + self.fc2(F.gelu(self.fc1(self.final_layer_norm(h))))  # [N, d]


class AudioEncoder(nn.Module):
    """mel [128, F] per clip -> thinker-width embeddings [audio_token_count(F), output_dim]."""

    def __init__(self, config: AudioEncoderConfig, window_cache: int = WINDOW_CACHE):
        super().__init__()
        c = self.config = config
        self.window_cache = FeatureCache(window_cache)  # chained window key -> its tokens [n_w, output_dim]
        hidden = c.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, hidden, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        self.conv_out = nn.Linear(hidden * c.conv_freq_bins, c.d_model, bias=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(c) for _ in range(c.encoder_layers))
        self.ln_post = nn.LayerNorm(c.d_model)
        self.proj1 = nn.Linear(c.d_model, c.d_model)
        self.proj2 = nn.Linear(c.d_model, c.output_dim)

    def forward(self, clips: Sequence[torch.Tensor], keys: Sequence[Sequence[tuple[int, int]]] | None = None) -> list[torch.Tensor]:
        """Several clips (mel [num_mel_bins, F_i]) in one pass; one [n_i, output_dim] per clip.

        Each clip is cut at its attention windows (``n_window_infer`` frames; the last one may be shorter):
        a window's tokens depend on its own frames only, so the windows of all clips are encoded as one
        packed sequence, and a window whose key (``keys[i][w]``, ``content_keys.audio_window_keys``) the
        cache holds is not encoded again.
        """
        parts: list[list[torch.Tensor | None]] = []
        todo: list[tuple[int, int, tuple[int, int] | None, torch.Tensor, int]] = []  # (clip, window, key, frames, chunk width)
        for i, mel in enumerate(clips):
            lengths = audio_chunk_lengths(mel.shape[1], self.config.n_window)
            if not lengths:
                raise ValueError("an audio clip needs at least one mel frame")
            starts = range(0, mel.shape[1], self.config.n_window_infer)
            parts.append([None] * len(starts))
            for w, start in enumerate(starts):
                key = keys[i][w] if keys is not None else None
                parts[i][w] = self.window_cache.get(key) if key is not None else None
                if parts[i][w] is None:
                    todo.append((i, w, key, mel[:, start : start + self.config.n_window_infer], max(lengths)))
        if todo:
            for (i, w, key, _, _), out in zip(todo, self._encode([(m, width) for *_, m, width in todo])):
                parts[i][w] = out
                if key is not None:
                    self.window_cache.put(key, out)
        return [torch.cat(p) for p in parts]

    def _encode(self, windows: Sequence[tuple[torch.Tensor, int]]) -> list[torch.Tensor]:
        """Windows (frames [M, L], chunks padded to ``width``) -> one [n_w, output_dim] each, attending within each."""
        tokens = [self._clip_tokens(mel, width) for mel, width in windows]  # [n_w, d] each
        x = torch.cat(tokens)  # [N, d]
        layout = WindowLayout([t.shape[0] for t in tokens], x.device)
        for layer in self.layers:
            x = layer(x, layout)  # [N, d]
        x = self.proj2(F.gelu(self.proj1(self.ln_post(x))))  # [N, output_dim]
        return list(x.split([t.shape[0] for t in tokens]))

    def _clip_tokens(self, mel: torch.Tensor, width: int) -> torch.Tensor:
        """Convolved chunk tokens of frames [M, L], positions added, padding dropped: [n, d]. Chunks are padded
        to ``width``, the clip's longest chunk (the reference pads them so)."""
        c = self.config
        lengths = audio_chunk_lengths(mel.shape[1], c.n_window)
        chunks = mel.to(self.conv2d1.weight.dtype).split(lengths, dim=1)  # each [M, L]
        padded = torch.stack([F.pad(ch, (0, width - ch.shape[1])) for ch in chunks])[:, None]  # [n, 1, M, width]
        h = F.gelu(self.conv2d3(F.gelu(self.conv2d2(F.gelu(self.conv2d1(padded))))))  # [n, C, M', t]
        n, ch, f, t = h.shape
        h = self.conv_out(h.permute(0, 3, 1, 2).reshape(n, t, ch * f))  # [n, t, d]
        h = h + sinusoid_positions(t, c.d_model).to(h.device, h.dtype)  # restarts in every chunk
        keep = torch.tensor([conv_length(L) for L in lengths], device=h.device)  # [n]
        valid = torch.arange(t, device=h.device)[None, :] < keep[:, None]  # [n, t]
        return h[valid]  # [n_tokens, d]

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        """The stateless-engine entry: each item's inputs hold ``mel`` [M, F] (on the CPU, as the request
        brought it: its window keys are digests of its bytes)."""
        mels = [torch.as_tensor(item.inputs[INPUT_SLOT]) for item in batch]
        keys = [audio_window_keys(m.cpu().numpy(), self.config.n_window_infer) for m in mels]
        device = self.conv2d1.weight.device
        with torch.inference_mode():
            out = self([m.to(device) for m in mels], keys)
        return [{OUTPUT_NAME: o} for o in out]

