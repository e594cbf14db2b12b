"""Audio bytes -> mono float32 at 16 kHz (numpy + soundfile, torch-free).

Decoding is libsndfile's (the ``soundfile`` package the project already
depends on): WAV, FLAC, MP3 and OGG (Vorbis, Opus) decode; AAC / M4A, WebM
and WMA do not (libsndfile has no decoder for them) and raise
``AudioDecodeError``. Channels are averaged. Other rates are resampled by a
Kaiser-windowed sinc (band-limited to the lower of the two Nyquist rates,
16 zero crossings, polyphase over the rate ratio).
"""

from __future__ import annotations

import io
import math

import numpy as np

TARGET_RATE = 16000
ZERO_CROSSINGS = 16
KAISER_BETA = 8.6
_BLOCK = 1 << 15  # output samples computed per gather


class AudioDecodeError(ValueError):
    """The bytes are not audio that libsndfile decodes."""


def load_audio(data: bytes, target_rate: int = TARGET_RATE, max_seconds: float | None = None) -> np.ndarray:
    """Decode ``data`` (wav / flac / mp3 / ogg) to mono float32 at ``target_rate``."""
    import soundfile as sf

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate = f.samplerate
            limit = -1 if max_seconds is None else int(max_seconds * rate) + 1
            frames = f.read(frames=limit, dtype="float32", always_2d=True)  # [N, C]
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError) as e:
        raise AudioDecodeError(f"not audio libsndfile can decode (wav, flac, mp3, ogg): {e}") from None
    if max_seconds is not None and len(frames) > max_seconds * rate:
        raise AudioDecodeError(f"the audio is longer than {max_seconds:g} s")
    if len(frames) == 0:
        raise AudioDecodeError("the audio is empty")
    return resample(frames.mean(axis=1), rate, target_rate)


def resample(x: np.ndarray, src_rate: int, dst_rate: int = TARGET_RATE) -> np.ndarray:
    """Band-limited resampling of mono ``x`` [N] from ``src_rate`` to ``dst_rate``: float32 [ceil(N * dst / src)].

    Output sample n sits at input time n * src / dst; its value is the input
    convolved with a windowed sinc centred there. The fractional offsets
    repeat with period ``up`` (dst / gcd), so one filter per phase is built
    once: [up, taps].
    """
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if src_rate == dst_rate:
        return x.copy()
    if src_rate <= 0 or dst_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {src_rate} and {dst_rate}")
    g = math.gcd(src_rate, dst_rate)
    up, down = dst_rate // g, src_rate // g
    cutoff = min(1.0, dst_rate / src_rate)  # of the input's Nyquist
    half = math.ceil(ZERO_CROSSINGS / cutoff)  # taps each side of the centre
    filters = _phase_filters(up, half, cutoff)  # [up, 2 * half]
    n_out = -(-len(x) * up // down)
    padded = np.pad(x.astype(np.float64), (half, half + 1))
    out = np.empty(n_out, dtype=np.float32)
    offsets = np.arange(2 * half)
    for lo in range(0, n_out, _BLOCK):
        n = np.arange(lo, min(n_out, lo + _BLOCK))
        base, phase = (n * down) // up, (n * down) % up  # input index left of the centre, and the fraction
        window = padded[base[:, None] + 1 + offsets[None, :]]  # [block, taps]: inputs base - half + 1 .. base + half
        out[lo : lo + len(n)] = np.einsum("bt,bt->b", window, filters[phase])
    return out


def _phase_filters(up: int, half: int, cutoff: float) -> np.ndarray:
    """Filter taps for each phase p (centre at base + p / up): [up, 2 * half] float64."""
    frac = np.arange(up)[:, None] / up  # [up, 1]
    k = np.arange(-half + 1, half + 1)[None, :]  # [1, taps] tap offset from base
    t = frac - k  # distance from each tap to the centre, in input samples
    window = np.i0(KAISER_BETA * np.sqrt(np.clip(1 - (t / (half + 1)) ** 2, 0, None))) / np.i0(KAISER_BETA)
    return cutoff * np.sinc(cutoff * t) * window
