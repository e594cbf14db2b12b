"""The small pieces: stop matching, detokenizing bytes, strict JSON, audio framing, merging, the fake engine."""

from __future__ import annotations

import asyncio
import io
import struct

import numpy as np
import pytest
import soundfile as sf

from walkserve.api.audio.formats import AudioFormats
from walkserve.api.audio.pcm import WavStream, encode_wav, pcm16
from walkserve.api.audio.sndfile import mp3_frame_length
from walkserve.api.config import ServerConfig
from walkserve.api.errors import ApiError, scrub
from walkserve.api.handlers import param_path
from walkserve.api.merge import EventMerger
from walkserve.api.strict_json import loads_strict
from walkserve.api.text_stream import StopMatcher, TextStream
from walkserve.core.errors import AdmissionRejected, ConfigError
from walkserve.core.outputs import RequestFinished
from walkserve.core.sampling import SamplingParams
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig
from walkserve.testing.fake_processor import EOS_ID, ByteDetokenizer


@pytest.mark.parametrize("pieces", [["ab", "cSTOPd"], ["abST", "OP"], ["a", "b", "S", "T", "O", "P", "x"], ["abSTO", "Pzz"]])
def test_stop_matcher_finds_split_stops(pieces: list[str]) -> None:
    matcher = StopMatcher(("STOP", "XYZW"))
    out, hit = "", False
    for piece in pieces:
        text, hit = matcher.push(piece)
        out += text
        if hit:
            break
    assert hit and out == "".join(pieces).split("STOP")[0]


def test_stop_matcher_earliest_and_flush() -> None:
    matcher = StopMatcher(("cd", "b"))
    assert matcher.push("abcd") == ("a", True)
    matcher = StopMatcher(("zz",))
    assert matcher.push("abz") == ("ab", False)
    assert matcher.flush() == "z"


def test_byte_detokenizer_never_splits_characters() -> None:
    text = "ça 日本語 🙂!"
    detok = ByteDetokenizer()
    pieces = [detok.push([b]) for b in text.encode()] + [detok.push([EOS_ID]), detok.flush()]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)
    stream = TextStream(ByteDetokenizer(), ("本",))
    out = "".join(stream.push([b]) for b in text.encode())
    assert out == "ça 日" and stream.stopped


def test_strict_json() -> None:
    assert loads_strict(b'{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    for bad, param in ((b'{"a": NaN}', "a"), (b'{"a": {"b": [0, -Infinity]}}', "a.b[1]"), (b'{"t": 1e999}', "t")):
        with pytest.raises(ApiError) as info:
            loads_strict(bad)
        assert info.value.status == 400 and info.value.param == param


def test_scrub_and_param_path() -> None:
    assert scrub("failed at /home/x/secret.py line 3, obj 0x7fabcdef12\nTraceback...") == "failed at <path> line 3, obj <addr>"
    assert param_path(("body", "messages", 0, "content", "tagged-union[TextPart]", "text")) == "messages[0].content.text"


def test_wav_header_and_stream() -> None:
    samples = np.linspace(-1, 1, 1000, dtype=np.float32)
    whole = encode_wav(samples, 16000)
    assert struct.unpack("<I", whole[4:8])[0] == 36 + 2000 and struct.unpack("<I", whole[40:44])[0] == 2000
    decoded, rate = sf.read(io.BytesIO(whole), dtype="int16")
    assert rate == 16000 and decoded.tobytes() == pcm16(samples)
    stream = WavStream(16000)
    streamed = stream.push(samples[:500]) + stream.push(samples[500:]) + stream.finish()
    assert streamed[44:] == whole[44:] and streamed[40:44] == b"\xff\xff\xff\xff"


def test_mp3_frame_length() -> None:
    assert mp3_frame_length(bytes.fromhex("fff384c4")) == 192  # MPEG-2 L3, 64 kbit/s, 24 kHz
    assert mp3_frame_length(bytes.fromhex("fffb9064")) == 417  # MPEG-1 L3, 128 kbit/s, 44.1 kHz
    assert mp3_frame_length(b"RIFF") is None


def test_audio_format_probe() -> None:
    formats = AudioFormats(24000)
    assert {"wav", "pcm", "flac", "mp3", "opus"} <= set(formats.names)
    assert formats.get("pcm16").name == "pcm" and formats.default() == "mp3"
    assert AudioFormats(None).names == []
    assert "opus" not in AudioFormats(22050).names  # Opus takes 8/12/16/24/48 kHz only


def test_an_answer_without_audio_is_a_file_every_format_reads() -> None:
    """Speech can end before its first frame (end-of-speech at once, max_tokens under one frame): each format, whole
    and streamed, is still a file its decoder opens, and silent. A /v1/audio/speech client with ``max_tokens`` 6 got
    empty FLAC and MP3 bodies, an Ogg/Opus no reader opened, and a 500 for AAC."""
    formats = AudioFormats(24000)
    for name in formats.names:
        fmt = formats.get(name)
        for data in (fmt.encode(np.zeros(0, np.float32), 24000), fmt.stream(24000).finish()):
            samples = _decode(data, name)
            assert np.abs(samples).max(initial=0) < 1e-3, name


def _decode(data: bytes, name: str) -> np.ndarray:
    if name == "pcm":
        return np.frombuffer(data, "<i2")
    if name == "aac":
        import av

        with av.open(io.BytesIO(data)) as container:
            return np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    return sf.read(io.BytesIO(data), dtype="float32")[0]


def test_server_config_validation() -> None:
    assert ServerConfig().host == "127.0.0.1"
    for bad in ({"max_n": 0}, {"port": 70000}, {"api_key": " "}, {"media_allowlist": ("example.com",)}, {"max_body_bytes": -1},
                {"max_ws_message_bytes": 0}, {"default_max_tokens": 0}, {"default_max_tokens": 2.5}, {"default_max_tokens": True},
                {"realtime_max_event_bytes": 2048, "realtime_max_frame_bytes": 2048}):
        with pytest.raises(ConfigError):
            ServerConfig(**bad)
    # uvicorn reads up to the larger route ceiling: the realtime one (twice the event limit unless set), or openpi's
    assert ServerConfig(realtime_max_event_bytes=20 * 2**20).ws_max_size == 40 * 2**20
    assert ServerConfig(realtime_max_event_bytes=2**20, realtime_max_frame_bytes=3 * 2**20).realtime_frame_ceiling == 3 * 2**20
    assert ServerConfig(realtime_max_event_bytes=2**20).ws_max_size == 17 * 2**20


def test_default_max_tokens_replaces_the_cards_default() -> None:
    from walkserve.api.state import card_with_defaults
    from walkserve.testing.fake_engine import FakeEngineConfig

    card = FakeEngineConfig(default_sampling={"max_tokens": 500, "temperature": 0.5}).card()
    assert card_with_defaults(card, ServerConfig()) is card
    replaced = card_with_defaults(card, ServerConfig(default_max_tokens=7))
    assert replaced.default_sampling == {"max_tokens": 7, "temperature": 0.5} and card.default_sampling["max_tokens"] == 500


async def test_merger_interleaves_and_closes() -> None:
    closed: list[int] = []

    async def source(index: int, count: int, delay: float):
        try:
            for i in range(count):
                await asyncio.sleep(delay)
                yield i
        finally:
            closed.append(index)

    merger = EventMerger([source(0, 3, 0.001), source(1, 1000, 0.001)])
    seen: list[tuple[int, int]] = []
    async for index, item in merger.items():
        seen.append((index, item))
        if index == 1 and item == 2:
            merger.close(1)
    assert [i for s, i in seen if s == 0] == [0, 1, 2]
    assert [i for s, i in seen if s == 1] == [0, 1, 2]
    assert sorted(closed) == [0, 1]


async def test_fake_engine_admission_abort_and_determinism() -> None:
    engine = FakeEngine(FakeEngineConfig(max_running=1, max_waiting=1, token_delay_s=0.001))
    spec = lambda: engine.processor.build_request("completion", {"prompt": "x"}, SamplingParams(max_tokens=500, ignore_eos=True, seed=4), engine.processor.check_params({}))  # noqa: E731
    first = engine.generate(spec())
    await first.__anext__()
    second = engine.generate(spec())
    waiting = asyncio.ensure_future(second.__anext__())
    await asyncio.sleep(0.01)
    assert engine.stats().running == 1 and engine.stats().waiting == 1
    with pytest.raises(AdmissionRejected):
        await engine.generate(spec()).__anext__()
    await first.aclose()  # breaking out aborts and frees the slot
    await waiting
    await engine.abort(second_id := (await anext_id(second)))
    events = [e async for e in second]
    assert isinstance(events[-1], RequestFinished) and events[-1].reason == "abort"
    assert engine.stats().running == 0 and engine.active_requests == 0 and second_id
    stats = engine.stats()
    assert stats.rejected == 1 and stats.aborted == 2


async def anext_id(stream) -> str:
    return (await stream.__anext__()).request_id


async def test_aac_only_with_pyav() -> None:
    """AAC is offered exactly when PyAV imports; then /v1/audio/speech returns ADTS that PyAV decodes."""
    from .helpers import asgi_client

    try:
        import av
    except ImportError:
        assert "aac" not in AudioFormats(24000).names
        async with asgi_client() as client:
            response = await client.post("/v1/audio/speech", json={"input": "x", "response_format": "aac"})
            assert response.status_code == 400 and "aac" not in response.json()["error"]["message"].split("available: ")[1]
        return
    async with asgi_client() as client:
        response = await client.post("/v1/audio/speech", json={"input": "sixteen chars!!!", "response_format": "aac"})
    assert response.status_code == 200 and response.headers["content-type"] == "audio/aac"
    with av.open(io.BytesIO(response.content)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(samples - 2 * 2400) <= 2048  # encoder priming and padding


def test_a_realtime_response_error_names_the_conversation_item_not_the_chat_message():
    from walkserve.api.errors import ApiError
    from walkserve.api.realtime.response import as_items

    sources = [None, "item_a", "item_b"]  # the instructions' system message, then the conversation's items
    audio = as_items(ApiError(400, "the audio is too short", "messages[2].content[0]", "invalid_value"), sources)
    assert (audio.param, audio.code) == ("item.content[0]", "invalid_value") and "item_b" in audio.message
    assert as_items(ApiError(400, "bad", "messages[0]", None), sources).param == "session.instructions"
    for param in ("messages", "messages[7].content", "model", None):  # no message of this response: as it was
        assert as_items(ApiError(400, "x", param, None), sources).param == param
