"""/v1/audio/transcriptions and /v1/audio/translations on the fake engine: shapes, prompt, errors.

The real model's answers (and their equality with chat completions) are in
tests/models/qwen3_omni/test_transcriptions.py.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
import soundfile as sf

from walkserve.api.openai.transcript_formats import cue_text, srt, timestamp, vtt
from walkserve.api.openai.transcription_prompt import instruction, transcription_messages
from walkserve.api.schemas.transcriptions import TranscriptionJson, TranscriptionVerboseJson
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

from .helpers import asgi_client, assert_envelope

SECONDS = 1.25


def wav(seconds: float = SECONDS, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, (0.1 * np.sin(np.arange(int(rate * seconds)) / 9)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def files(data: bytes | None = None, name: str = "clip.wav") -> dict:
    return {"file": (name, wav() if data is None else data, "audio/wav")}


async def post(route: str = "/v1/audio/transcriptions", data: dict | None = None, upload: dict | None = None, **config):
    async with asgi_client(**config) as client:
        return await client.post(route, data=data or {}, files=files() if upload is None else upload)


def test_prompt_names_language_task_and_context() -> None:
    assert instruction("transcribe", None, None) == "Transcribe the audio into text. Output only the transcript."
    assert "German audio" in instruction("transcribe", "German", None)
    translated = instruction("translate", "French", "Jean, Marie")
    assert "French audio" in translated and "into English" in translated and translated.endswith("Jean, Marie")


async def chat_answer(client, task: str, language: str | None, context: str | None) -> str:
    """The chat completion a client would send with the transcription prompt (the fake model's text hashes its prompt)."""
    messages = transcription_messages(task, wav(), "wav", language, context)
    response = await client.post("/v1/chat/completions", json={"messages": messages, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(("route", "task"), [("/v1/audio/transcriptions", "transcribe"), ("/v1/audio/translations", "translate")])
async def test_json_is_the_chat_answer_to_the_prompt(route: str, task: str) -> None:
    async with asgi_client() as client:
        response = await client.post(route, data={"language": "de", "prompt": "Bahnhof", "model": "fake-tiny"}, files=files())
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["text"] == await chat_answer(client, task, "German", "Bahnhof")
        assert body["text"] != await chat_answer(client, task, "French", "Bahnhof")  # the hint reaches the prompt
        assert body["text"] != await chat_answer(client, task, "German", None)  # and so does the client's prompt
    assert body["usage"]["type"] == "tokens" and body["usage"]["output_tokens"] > 0
    assert TranscriptionJson.model_validate(body).model_dump() == body  # the OpenAPI document's shape, exactly
    assert body["usage"]["total_tokens"] == body["usage"]["input_tokens"] + body["usage"]["output_tokens"]


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt"])
async def test_text_formats(fmt: str) -> None:
    json_text = (await post()).json()["text"]
    response = await post(data={"response_format": fmt})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/vtt" if fmt == "vtt" else "text/plain")
    if fmt == "text":
        assert response.text == json_text
    else:
        sep = "," if fmt == "srt" else "."
        head = "1" if fmt == "srt" else "WEBVTT\n"
        assert response.text == f"{head}\n00:00:00{sep}000 --> 00:00:01{sep}250\n{cue_text(json_text)}\n\n"


async def test_verbose_json() -> None:
    response = await post(data={"response_format": "verbose_json", "language": "EN"})
    body = response.json()
    assert body["task"] == "transcribe" and body["language"] == "english" and body["duration"] == SECONDS
    assert body["segments"] == [{"id": 0, "seek": 0, "start": 0.0, "end": SECONDS, "text": body["text"],
                                 "temperature": 0.0, "compression_ratio": body["segments"][0]["compression_ratio"]}]
    assert body["segments"][0]["compression_ratio"] > 0
    assert TranscriptionVerboseJson.model_validate(body).model_dump() == body  # the OpenAPI document's shape, exactly
    translated = (await post("/v1/audio/translations", data={"response_format": "verbose_json"})).json()
    assert translated["task"] == "translate" and translated["language"] == "unknown"


async def test_stream_events() -> None:
    response = await post(data={"stream": "true"})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    deltas, done = events[:-1], events[-1]
    assert deltas and all(e["type"] == "transcript.text.delta" for e in deltas)
    assert done["type"] == "transcript.text.done"
    assert done["text"] == "".join(e["delta"] for e in deltas) == (await post()).json()["text"]
    assert done["usage"]["output_tokens"] > 0


def test_subtitle_shapes() -> None:
    assert timestamp(3723.4567, ",") == "01:02:03,457"
    assert cue_text("a\n\n b --> c\n") == "a\nb -> c"
    assert re.fullmatch(r"1\n00:00:00,000 --> 00:00:02,500\nhi\n\n", srt("hi", 2.5))
    assert vtt("hi", 61.0) == "WEBVTT\n\n00:00:00.000 --> 00:01:01.000\nhi\n\n"


@pytest.mark.parametrize(("data", "upload", "param", "code"), [
    ({"prompt": "x"}, {}, "file", None),  # no file
    ({}, files(b"not audio at all"), "file", "invalid_audio"),
    ({}, files(b""), "file", "invalid_audio"),
    ({"response_format": "docx"}, None, "response_format", None),
    ({"temperature": "3"}, None, "temperature", None),
    ({"temperature": "NaN"}, None, "temperature", None),
    ({"language": "klingon"}, None, "language", "unsupported_language"),
    ({"stream": "true", "response_format": "srt"}, None, "stream", "unsupported_format"),
])
async def test_bad_input_is_a_400_envelope(data: dict, upload: dict | None, param: str, code: str | None) -> None:
    for route in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        assert_envelope(await post(route, data, upload), 400, param=param, code=code)


async def test_long_audio_is_refused() -> None:
    assert_envelope(await post(max_audio_seconds=1.0), 400, param="file", code="audio_too_long")


async def test_unknown_model_is_a_404() -> None:
    assert_envelope(await post(data={"model": "whisper-1"}), 404, param="model", code="model_not_found")


async def test_model_without_audio_input_cannot_transcribe() -> None:
    engine = FakeEngine(FakeEngineConfig(audio_in=False, token_delay_s=0.0))
    async with asgi_client(engine) as client:
        response = await client.post("/v1/audio/transcriptions", files=files())
    error = assert_envelope(response, 400, param="model", code="unsupported_capability")
    assert "transcription" in error["message"]


async def test_json_body_is_refused() -> None:
    async with asgi_client() as client:
        response = await client.post("/v1/audio/transcriptions", json={"file": "x"})
    assert response.status_code in (400, 415)
    assert_envelope(response, response.status_code)


async def test_metrics_name_the_route() -> None:
    async with asgi_client() as client:
        for route in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            assert (await client.post(route, files=files())).status_code == 200
        text = (await client.get("/metrics")).text
    for route in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        assert f'walkserve_e2e_request_latency_seconds_count{{route="{route}"}} 1.0' in text


@pytest.mark.parametrize("fmt", ["FLAC", "OGG"])
async def test_other_containers(fmt: str) -> None:
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(16000, np.float32) + 0.01, 16000, format=fmt)
    upload = {"file": (f"clip.{fmt.lower()}", buffer.getvalue(), "application/octet-stream")}
    response = await post(data={"response_format": "verbose_json"}, upload=upload)
    assert response.status_code == 200, response.text
    assert response.json()["duration"] == 1.0
