"""walkserve.client.Client and AsyncClient against a live server."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from walkserve.client import APIError, AsyncClient, Client
from walkserve.testing.fake_engine import FAIL_MAGIC, FakeEngine, FakeEngineConfig

from .helpers import live_server


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (0, 100, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_sync_client_routes(base_url: str, tmp_path: Path) -> None:
    with Client(base_url) as client:
        assert client.health()["ok"] is True
        assert client.models()[0]["id"] == "fake-tiny"
        whole = client.completions("abc", max_tokens=6)
        chunks = list(client.completions_stream("abc", max_tokens=6))
        assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
        chat = client.chat("hello", seed=1)
        streamed = [c for c in client.chat_stream("hello", seed=1, stream_options={"include_usage": True})]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed if c["choices"])
        assert text == chat["choices"][0]["message"]["content"] and streamed[-1]["usage"]["total_tokens"] > 0
        wav = client.speech("sixteen chars!!!", voice="zoe", response_format="wav")
        samples, rate = sf.read(io.BytesIO(wav))
        assert rate == 24000 and len(samples) == 2 * 2400
        path = client.speech_to_file(tmp_path / "out.flac", "sixteen chars!!!", response_format="flac")
        assert sf.info(str(path)).frames == 2 * 2400
        raw = b"".join(client.speech_stream("sixteen chars!!!", response_format="pcm"))
        sse = b"".join(client.speech_stream("sixteen chars!!!", response_format="pcm", stream_format="sse"))
        assert raw == sse and len(raw) == 2 * 2400 * 2
        images = client.images("a dot", n=2, size="3x2")
        assert len(images) == 2 and Image.open(io.BytesIO(images[0])).size == (3, 2)
        edited = client.image_edit(png(2, 2), "invert")
        assert np.asarray(Image.open(io.BytesIO(edited[0])))[0, 0].tolist() == [255, 155, 55]
        events = list(client.generate({"prompt": "hi"}, sampling={"max_tokens": 3}))
        assert [e["type"] for e in events] == ["output"] * 3 + ["finished"]


def test_sync_client_errors(base_url: str) -> None:
    with Client(base_url) as client:
        with pytest.raises(APIError) as info:
            client.chat("x", temperature=-1)
        assert info.value.status == 400 and info.value.param == "temperature"
        with pytest.raises(APIError) as info:
            list(client.chat_stream(FAIL_MAGIC))
        assert info.value.code == "request_failed"
        with pytest.raises(APIError) as info:
            list(client.generate({"prompt": FAIL_MAGIC}))
        assert info.value.code == "request_failed"
    with Client(base_url, model="other") as client, pytest.raises(APIError) as info:
        client.completions("x")
    assert info.value.status == 404


async def test_async_client_routes(base_url: str) -> None:
    async with AsyncClient(base_url) as client:
        assert (await client.health())["http_status"] == 200
        assert (await client.models())[0]["random_weights"] is True
        whole = await client.completions("abc", max_tokens=6)
        chunks = [c async for c in client.completions_stream("abc", max_tokens=6)]
        assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
        chat = await client.chat([{"role": "user", "content": "hey"}], max_tokens=5)
        assert chat["choices"][0]["finish_reason"] == "length"
        deltas = [c async for c in client.chat_stream("hey", max_tokens=5)]
        assert deltas[0]["choices"][0]["delta"]["role"] == "assistant"
        mp3 = await client.speech("eight ch", response_format="mp3")
        assert len(sf.read(io.BytesIO(mp3))[0]) > 1000
        pieces = [p async for p in client.speech_stream("eight ch", response_format="wav")]
        assert b"".join(pieces)[:4] == b"RIFF"
        assert len(await client.images("x", size="2x2")) == 1
        assert len(await client.image_edit(png(3, 3), "y")) == 1
        events = [e async for e in client.generate({"prompt": "hi"}, sampling={"max_tokens": 2})]
        assert events[-1]["finish_reason"] == "length"
        with pytest.raises(APIError):
            await client.speech("x", voice="nobody")


async def test_api_key_through_the_sdk() -> None:
    engine = FakeEngine(FakeEngineConfig(token_delay_s=0.0))
    with live_server(engine, api_key="k1") as url:
        async with AsyncClient(url, api_key="k1") as good, AsyncClient(url, api_key="k2") as bad:
            assert (await good.completions("x", max_tokens=1))["usage"]["completion_tokens"] == 1
            with pytest.raises(APIError) as info:
                await bad.completions("x", max_tokens=1)
            assert info.value.status == 401
