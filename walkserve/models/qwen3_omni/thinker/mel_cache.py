"""MelCache: the mel power of recent clips' final frames, so a clip resent longer (audio prefilled while it
arrives, then committed) filters only its new frames (torch-free).

An entry is a clip's wave digest and length and its ``final_frames`` columns of ``mel_power``; a clip whose
first samples are an entry's wave takes those columns and computes the rest. ``mel_power`` applies the
filters in fixed blocks, so the result is the same bits as computing the clip whole; the log and the
clip-wide floor (``log_compress``) are always applied to the whole clip. Least recent entries go first.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from walkserve.models.qwen3_omni.thinker.audio_features import (
    N_FFT,
    final_frames,
    log_compress,
    mel_power,
)
from walkserve.models.qwen3_omni.thinker.audio_load import clip_digest, same_clip


class MelCache:
    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, int, bytes], np.ndarray] = OrderedDict()  # (n_mels, n, digest)

    def features(self, wave: np.ndarray, n_mels: int) -> np.ndarray:
        """float32 [n_mels, len // 160]: ``log_mel_clip(wave)``."""
        wave = np.ascontiguousarray(wave, dtype=np.float32).reshape(-1)
        if wave.shape[0] <= N_FFT // 2:
            raise ValueError(f"an audio clip needs more than {N_FFT // 2} samples, got {wave.shape[0]}")
        mel = mel_power(wave, n_mels, self._longest_prefix(wave, n_mels))
        if self.capacity > 0:
            key = (n_mels, len(wave), clip_digest(wave))
            self._entries[key] = mel[:, : final_frames(len(wave))].copy()
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return log_compress(mel)

    def _longest_prefix(self, wave: np.ndarray, n_mels: int) -> np.ndarray | None:
        best = None
        for (mels, n, digest), columns in self._entries.items():
            if mels == n_mels and n <= len(wave) and (best is None or columns.shape[1] > best.shape[1]) \
                    and same_clip(wave[:n], digest):
                best = columns
        return best

