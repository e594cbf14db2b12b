"""AAC (ADTS) through PyAV, only when the optional ``av`` package is installed."""

from __future__ import annotations

import io

import numpy as np

from walkserve.api.audio.sndfile import not_empty


def pyav_available() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def encode_aac(samples: np.ndarray, sample_rate: int) -> bytes:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="adts") as container:
        stream = container.add_stream("aac", rate=sample_rate, layout="mono")
        planar = not_empty(samples)[None, :]  # planar: [1, N]
        frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout="mono")
        frame.sample_rate = sample_rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()
