"""FLAC, MP3 and Ogg/Opus through libsndfile (the ``soundfile`` package)."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

from walkserve.api.audio.stream_encoder import StreamEncoder

# format name -> (libsndfile major format, subtype)
SNDFILE_FORMATS = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
SILENT_SAMPLE = np.zeros(1, np.float32)


def not_empty(samples: np.ndarray) -> np.ndarray:
    """An answer without audio (speech that ended at once) as one silent sample: of no samples, libsndfile writes
    no FLAC or MP3 at all and an Ogg/Opus no reader opens, and PyAV's AAC encoder fails."""
    samples = np.asarray(samples, dtype=np.float32)
    return samples if len(samples) else SILENT_SAMPLE


def encode_sndfile(name: str, samples: np.ndarray, sample_rate: int) -> bytes:
    major, subtype = SNDFILE_FORMATS[name]
    buffer = io.BytesIO()
    sf.write(buffer, not_empty(samples), sample_rate, format=major, subtype=subtype)
    return buffer.getvalue()


class _Sink:
    """A seekable file for libsndfile that hands out bytes once written; rewrites of bytes
    already sent (header updates at close) are dropped, which decoders accept for MP3 CBR."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.pos = 0
        self.sent = 0

    def write(self, data) -> int:
        data = bytes(data)
        end = self.pos + len(data)
        if end > len(self.buffer):
            self.buffer.extend(b"\0" * (end - len(self.buffer)))
        self.buffer[self.pos : end] = data
        self.pos = end
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: len(self.buffer)}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, size: int = -1) -> bytes:
        end = len(self.buffer) if size < 0 else min(len(self.buffer), self.pos + size)
        data = bytes(self.buffer[self.pos : end])
        self.pos = end
        return data

    def take(self) -> bytes:
        data = bytes(self.buffer[self.sent :])
        self.sent = len(self.buffer)
        return data


_MP3_BITRATES = {
    True: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),  # MPEG-1 layer III, kbit/s
    False: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),  # MPEG-2 / 2.5 layer III
}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mp3_frame_length(header: bytes) -> int | None:
    """Bytes in the MPEG layer III frame starting with ``header`` (None if it is not one)."""
    if len(header) < 4 or header[0] != 0xFF or (header[1] & 0xE0) != 0xE0:
        return None
    version, layer = (header[1] >> 3) & 3, (header[1] >> 1) & 3
    bitrate_index, rate_index, padding = header[2] >> 4, (header[2] >> 2) & 3, (header[2] >> 1) & 1
    if layer != 1 or version not in _MP3_RATES or rate_index == 3 or bitrate_index in (0, 15):
        return None
    mpeg1 = version == 3
    bitrate = _MP3_BITRATES[mpeg1][bitrate_index] * 1000
    return (144 if mpeg1 else 72) * bitrate // _MP3_RATES[version][rate_index] + padding


class Mp3Stream(StreamEncoder):
    """MP3 frames as LAME produces them, at a constant bitrate so a decoder can size the stream.

    libsndfile opens the file with a blank "Xing" frame that it fills in at
    close; a stream cannot go back for it, so that frame is left out.
    """

    def __init__(self, sample_rate: int):
        # soundfile applies bitrate_mode only together with a compression level (0.5: 80 kbit/s at 24 kHz)
        self._pending = b""
        self._skipped = False
        self._pushed = False
        self._sink = _Sink()
        self._file = sf.SoundFile(
            self._sink, mode="w", samplerate=sample_rate, channels=1, format="MP3",
            subtype="MPEG_LAYER_III", bitrate_mode="CONSTANT", compression_level=0.5,
        )

    def push(self, samples: np.ndarray) -> bytes:
        self._file.write(np.asarray(samples, dtype=np.float32))
        self._pushed = self._pushed or len(samples) > 0
        return self._without_blank_frame(self._sink.take())

    def finish(self) -> bytes:
        if not self._pushed:
            self._file.write(SILENT_SAMPLE)
        self._file.close()
        return self._without_blank_frame(self._sink.take(), final=True)

    def _without_blank_frame(self, data: bytes, final: bool = False) -> bytes:
        if self._skipped:
            return data
        self._pending += data
        length = mp3_frame_length(self._pending[:4])
        if length is None or len(self._pending) < length:
            if not final and len(self._pending) < 4096:
                return b""
            self._skipped = True
            return self._pending
        frame, rest = self._pending[:length], self._pending[length:]
        self._skipped = True
        self._pending = b""
        blank = not any(frame[4:])
        return rest if blank else frame + rest
