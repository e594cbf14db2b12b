"""Raw s16le PCM and WAV, written by hand (no library needed)."""

from __future__ import annotations

import base64
import struct

import numpy as np

from walkserve.api.audio.stream_encoder import StreamEncoder

UNKNOWN_SIZE = 0xFFFFFFFF  # a streamed WAV's RIFF and data sizes: "until the end of the stream"


def pcm16(samples: np.ndarray) -> bytes:
    """float32 [-1, 1] -> little-endian int16 bytes."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return np.round(clipped * 32767.0).astype("<i2").tobytes()


def pcm16_base64(samples: np.ndarray) -> str:
    """One streamed chunk of spoken output (talker -> Code2Wav float32) as base64 pcm16: the ``delta.audio.data`` of
    streamed chat completions and the ``delta`` of the realtime route's ``response.output_audio.delta``."""
    return base64.b64encode(pcm16(samples)).decode()


def wav_header(sample_rate: int, data_bytes: int | None, channels: int = 1) -> bytes:
    """A 44-byte PCM16 WAV header; ``data_bytes`` None writes the unknown-length marker."""
    data_size = UNKNOWN_SIZE if data_bytes is None else data_bytes
    riff_size = UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    block = 2 * channels
    fmt = struct.pack("<HHIIHH", 1, channels, sample_rate, sample_rate * block, block, 16)
    return b"RIFF" + struct.pack("<I", riff_size) + b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", data_size)


def encode_pcm(samples: np.ndarray, sample_rate: int) -> bytes:
    return pcm16(samples)


def encode_wav(samples: np.ndarray, sample_rate: int) -> bytes:
    data = pcm16(samples)
    return wav_header(sample_rate, len(data)) + data


class PcmStream(StreamEncoder):
    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate

    def push(self, samples: np.ndarray) -> bytes:
        return pcm16(samples)

    def finish(self) -> bytes:
        return b""


class WavStream(StreamEncoder):
    """The header goes first with unknown sizes (0xFFFFFFFF), then PCM16 as it comes."""

    def __init__(self, sample_rate: int):
        self._header = wav_header(sample_rate, None)

    def push(self, samples: np.ndarray) -> bytes:
        header, self._header = self._header, b""
        return header + pcm16(samples)

    def finish(self) -> bytes:
        header, self._header = self._header, b""
        return header
