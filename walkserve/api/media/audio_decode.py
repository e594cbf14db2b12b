"""Client audio -> mono float32 samples, with the duration cap checked while reading."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

from walkserve.api.errors import bad_request
from walkserve.core.array import ArrayData


def decode_audio(data: bytes, max_seconds: float, param: str) -> tuple[ArrayData, int]:
    """Any container libsndfile reads (wav, flac, mp3, ogg) -> (float32 [N], sample_rate)."""
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate = f.samplerate
            limit = int(max_seconds * rate)
            frames = f.read(frames=limit + 1, dtype="float32", always_2d=True)  # frames: [N, C]
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError):
        raise bad_request("is not audio this server can decode", param, "invalid_audio") from None
    if len(frames) > limit:
        raise bad_request(f"the audio is longer than {max_seconds:g} seconds", param, "audio_too_long")
    if len(frames) == 0:
        raise bad_request("the audio is empty", param, "invalid_audio")
    mono = np.ascontiguousarray(frames.mean(axis=1), dtype=np.float32)  # mono: [N]
    return ArrayData("float32", (len(mono),), mono.tobytes()), rate
