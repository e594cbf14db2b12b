"""The audio formats this installation can write, probed once at start-up at the model's sample rate."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from walkserve.api.audio import pcm, pyav, sndfile
from walkserve.api.audio.stream_encoder import BufferedEncoder, StreamEncoder

log = logging.getLogger(__name__)

Encode = Callable[[np.ndarray, int], bytes]
ALIASES = {"pcm16": "pcm"}
MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
}
ORDER = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # OpenAI's list; mp3 is OpenAI's default


@dataclass(frozen=True)
class AudioFormat:
    """One writable format: whole-file encoder, stream encoder factory, whether streaming is incremental."""

    name: str
    media_type: str
    encode: Encode
    stream: Callable[[int], StreamEncoder]
    incremental: bool


def _candidates() -> list[AudioFormat]:
    out = [
        AudioFormat("wav", MEDIA_TYPES["wav"], pcm.encode_wav, pcm.WavStream, True),
        AudioFormat("pcm", MEDIA_TYPES["pcm"], pcm.encode_pcm, pcm.PcmStream, True),
        AudioFormat("mp3", MEDIA_TYPES["mp3"], partial(sndfile.encode_sndfile, "mp3"), sndfile.Mp3Stream, True),
    ]
    for name in ("flac", "opus"):
        encode = partial(sndfile.encode_sndfile, name)
        out.append(AudioFormat(name, MEDIA_TYPES[name], encode, partial(BufferedEncoder, encode), False))
    if pyav.pyav_available():
        out.append(AudioFormat("aac", MEDIA_TYPES["aac"], pyav.encode_aac, partial(BufferedEncoder, pyav.encode_aac), False))
    return out


def _works(fmt: AudioFormat, sample_rate: int) -> bool:
    tone = (0.1 * np.sin(np.arange(sample_rate // 10) * 0.05)).astype(np.float32)
    try:
        whole = fmt.encode(tone, sample_rate)
        stream = fmt.stream(sample_rate)
        streamed = stream.push(tone) + stream.finish()
    except Exception as e:  # any failure means "not available here"
        log.info("audio format %s unavailable at %d Hz: %s", fmt.name, sample_rate, e)
        return False
    return bool(whole) and bool(streamed)


class AudioFormats:
    """Name -> AudioFormat for the formats that encoded a probe tone at this sample rate."""

    def __init__(self, sample_rate: int | None):
        self.sample_rate = sample_rate
        found = {f.name: f for f in _candidates() if sample_rate and _works(f, sample_rate)}
        self._formats = {name: found[name] for name in ORDER if name in found}

    @property
    def names(self) -> list[str]:
        return list(self._formats)

    def get(self, name: str) -> AudioFormat | None:
        return self._formats.get(ALIASES.get(name, name))

    def default(self) -> str:
        return "mp3" if "mp3" in self._formats else "wav"
