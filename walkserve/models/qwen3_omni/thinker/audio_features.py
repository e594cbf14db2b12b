"""Whisper-style 128-bin log-mel features at 16 kHz (numpy only, torch-free: processors run in the frontend).

The function ``WhisperFeatureExtractor(feature_size=128)`` computes, with the
Qwen3-Omni processor's padding (every clip zero-padded to the longest clip of
the call, not to 30 s):

    x [N] float32 -> reflect-pad n_fft/2 on both sides -> frames of 400 every 160 (periodic Hann)
      -> |rfft|^2 [201, 1 + N/160] -> drop the last frame -> Slaney mel filters (0..8 kHz) [128, F]
         (applied to blocks of 100 frames, so a frame's values never depend on the frames after it:
         ``mel_cache.py`` reuses a grown clip's earlier frames bit for bit)
      -> log10(max(., 1e-10)) -> max(., max - 8) -> (. + 4) / 4

Valid frames per clip (the reference's feature mask, its sample mask taken
every 160th sample): the longest clip has N // 160, a shorter one
ceil(N / 160), as many as fit. Computed in float64, returned as float32.

``log_mel_batch`` is that call over several clips; the serving path takes
``log_mel_clip``, the call with one clip, for each clip of a request: padded
to the longest, a clip's last frames (and its frame count) would depend on
the other clips, so an earlier turn's clip would change (and miss the prefix
cache) when a later turn brings a longer one. The features of a clip are
final frame by frame except for two things the content keys catch
(``content_keys.py``): the last two frames read past the end (reflect
padding), and the floor ``max - 8`` is the whole clip's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 128
MEL_BLOCK = 100  # frames per product with the mel filters (mel_power)


@dataclass(frozen=True)
class MelBatch:
    """``features`` float32 [B, n_mels, F_max]; ``frames[b]``: valid frames of clip b (the feature mask)."""

    features: np.ndarray
    frames: tuple[int, ...]

    def clip(self, b: int) -> np.ndarray:
        """Clip b's valid features [n_mels, frames[b]] (what the audio encoder takes)."""
        return self.features[b, :, : self.frames[b]]


def log_mel_batch(clips: Sequence[np.ndarray], n_mels: int = N_MELS) -> MelBatch:
    """Features of the clips of one request (mono float at 16 kHz), padded to the longest clip."""
    if not clips:
        raise ValueError("no audio clips")
    waves = [np.asarray(c, dtype=np.float32).reshape(-1) for c in clips]
    for w in waves:
        if w.shape[0] <= N_FFT // 2:
            raise ValueError(f"an audio clip needs more than {N_FFT // 2} samples ({N_FFT // 2 / SAMPLE_RATE * 1e3:g} ms), "
                             f"got {w.shape[0]}")
    longest = max(w.shape[0] for w in waves)
    padded = np.zeros((len(waves), longest), dtype=np.float32)
    for b, w in enumerate(waves):
        padded[b, : w.shape[0]] = w
    features = np.stack([log_mel(p, n_mels) for p in padded])
    width = longest // HOP
    return MelBatch(features, tuple(min(-(-w.shape[0] // HOP), width) for w in waves))


def log_mel_clip(wave: np.ndarray, n_mels: int = N_MELS) -> np.ndarray:
    """float32 [n_mels, len // 160]: one clip's features, as the processor computes a clip given alone."""
    return np.ascontiguousarray(log_mel_batch([wave], n_mels).clip(0))


def log_mel(wave: np.ndarray, n_mels: int = N_MELS) -> np.ndarray:
    """float32 [n_mels, len // 160] log-mel of one (already padded) waveform."""
    return log_compress(mel_power(wave, n_mels))


def mel_power(wave: np.ndarray, n_mels: int = N_MELS, done: np.ndarray | None = None) -> np.ndarray:
    """float64 [n_mels, len // 160]: mel-filtered power of each frame. ``done``: the first columns, computed from a
    prefix of ``wave`` (``final_frames`` of it, whole blocks; ``MelCache``); the rest is computed here.

    The filters are applied to blocks of ``MEL_BLOCK`` frames, the last one zero-padded to a whole block, so
    every product has one shape and a frame's values never depend on how many frames follow it.
    """
    x = np.pad(np.asarray(wave, dtype=np.float64), N_FFT // 2, mode="reflect")
    n_frames = (x.shape[0] - N_FFT) // HOP  # the reference's last frame is dropped
    start = 0 if done is None else done.shape[1]
    starts = np.arange(start, n_frames) * HOP
    frames = x[starts[:, None] + np.arange(N_FFT)[None, :]] * _hann(N_FFT)  # [frames, n_fft]
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2  # [frames, n_fft/2 + 1]
    blocks = [] if done is None else [done]
    for lo in range(0, power.shape[0], MEL_BLOCK):
        block = power[lo : lo + MEL_BLOCK]
        whole = np.pad(block, ((0, MEL_BLOCK - block.shape[0]), (0, 0)))  # [MEL_BLOCK, bins]
        blocks.append((mel_filters(n_mels) @ whole.T)[:, : block.shape[0]])  # [n_mels, <= MEL_BLOCK]
    return np.concatenate(blocks, axis=1) if blocks else np.zeros((n_mels, 0))


def final_frames(n_samples: int) -> int:
    """Leading frames of ``mel_power`` over ``n_samples`` that read no sample past them (none of the reflect
    padding on the right), in whole ``MEL_BLOCK`` blocks: they stay the same when the wave grows."""
    frames = max(0, min(n_samples // HOP, (n_samples - N_FFT // 2) // HOP + 1))
    return frames // MEL_BLOCK * MEL_BLOCK


def log_compress(mel: np.ndarray) -> np.ndarray:
    """Mel power [n_mels, F] -> the features: log10, floored 8 below the clip's maximum, scaled (float32)."""
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


@lru_cache(maxsize=4)
def mel_filters(n_mels: int = N_MELS, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Slaney-scale triangular filters with Slaney area normalisation, 0 Hz .. 8 kHz: [n_mels, n_fft/2 + 1]."""
    fft_freqs = np.linspace(0, sample_rate // 2, 1 + n_fft // 2)  # [bins]
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), n_mels + 2))  # [n_mels + 2] Hz
    widths = np.diff(edges)  # [n_mels + 1]
    slopes = edges[None, :] - fft_freqs[:, None]  # [bins, n_mels + 2]
    rising = -slopes[:, :-2] / widths[:-1]
    falling = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))  # [bins, n_mels]
    filters *= 2.0 / (edges[2:] - edges[:-2])  # equal area per filter
    return filters.T


_MIN_LOG_HZ, _MIN_LOG_MEL, _LOG_STEP = 1000.0, 15.0, np.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    """Slaney: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    mel = 3.0 * hz / 200.0
    log_part = _MIN_LOG_MEL + np.log(np.maximum(hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOG_STEP
    return np.where(hz >= _MIN_LOG_HZ, log_part, mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = 200.0 * mel / 3.0
    log_part = _MIN_LOG_HZ * np.exp(_LOG_STEP * (mel - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, log_part, hz)


@lru_cache(maxsize=2)
def _hann(n: int) -> np.ndarray:
    """Periodic Hann window (torch.hann_window's default)."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)
