"""/v1/audio/transcriptions and /v1/audio/translations served by a tiny random Qwen3-Omni, through the openai package.

One server per module (the default one-rank placement). A transcription is the
chat completion with the transcription prompt and the audio part: the greedy
answers must be equal, token for token, in every response format and streamed.
"""

from __future__ import annotations

import io

import openai
import pytest
import soundfile as sf

from tests.api.real_server import in_thread_server
from tests.models.qwen3_omni.conftest import wave
from walkserve.api.openai.transcription_prompt import transcription_messages
from walkserve.core.config import RuntimeConfig
from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni

pytestmark = [pytest.mark.slow]
MAX_TOKENS = 6
SECONDS = 0.75


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny_qwen3_omni(tmp_path_factory.mktemp("omni_asr") / "tiny-omni", seed=5)
    with in_thread_server("qwen3-omni", path, RuntimeConfig(max_running=8), default_max_tokens=MAX_TOKENS,
                          max_audio_seconds=3.0) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def clip() -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, wave(SECONDS, seed=2), 16000, format="WAV")
    return buffer.getvalue()


def chat_text(client: openai.OpenAI, clip: bytes, task: str, language: str | None, context: str | None) -> str:
    messages = transcription_messages(task, clip, "wav", language, context)
    answer = client.chat.completions.create(model="tiny-omni", messages=messages, temperature=0)
    return answer.choices[0].message.content


def test_transcription_equals_the_chat_completion(client: openai.OpenAI, clip: bytes) -> None:
    result = client.audio.transcriptions.create(file=("clip.wav", clip), model="tiny-omni", language="en",
                                                prompt="walkserve", temperature=0)
    assert result.text and result.text == chat_text(client, clip, "transcribe", "English", "walkserve")
    # the equality is a real check: another instruction gets another answer from the same weights
    assert result.text != chat_text(client, clip, "translate", "German", None)
    assert result.usage.output_tokens == MAX_TOKENS and result.usage.input_tokens > 0
    plain = client.audio.transcriptions.create(file=("clip.wav", clip), model="tiny-omni")
    assert plain.text == chat_text(client, clip, "transcribe", None, None)


def test_translation_equals_the_chat_completion(client: openai.OpenAI, clip: bytes) -> None:
    result = client.audio.translations.create(file=("clip.wav", clip), model="tiny-omni", temperature=0)
    assert result.text == chat_text(client, clip, "translate", None, None)


def test_response_formats(client: openai.OpenAI, clip: bytes) -> None:
    text = client.audio.transcriptions.create(file=("clip.wav", clip), model="tiny-omni").text
    plain = client.audio.transcriptions.create(file=("clip.wav", clip), model="tiny-omni", response_format="text")
    assert plain == text
    subrip = client.audio.transcriptions.create(file=("clip.wav", clip), model="tiny-omni", response_format="srt")
    assert subrip.startswith("1\n00:00:00,000 --> 00:00:00,750\n") and subrip.endswith("\n\n")
    webvtt = client.audio.transcriptions.create(file=("clip.wav", clip), model="tiny-omni", response_format="vtt")
    assert webvtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:00.750\n")
    assert subrip.split("\n", 2)[2] == webvtt.split("\n", 3)[3]  # the same cue text
    verbose = client.audio.transcriptions.create(file=("clip.wav", clip), model="tiny-omni", language="de",
                                                 response_format="verbose_json")
    assert verbose.language == "german" and verbose.duration == SECONDS
    assert verbose.text == chat_text(client, clip, "transcribe", "German", None)
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [(0.0, SECONDS, verbose.text)]


def test_stream(client: openai.OpenAI, clip: bytes) -> None:
    events = list(client.audio.transcriptions.create(file=("clip.wav", clip), model="tiny-omni", stream=True))
    assert [e.type for e in events] == ["transcript.text.delta"] * (len(events) - 1) + ["transcript.text.done"]
    assert len(events) > 2
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == chat_text(client, clip, "transcribe", None, None)
    assert events[-1].usage.output_tokens == MAX_TOKENS


def test_bad_input(client: openai.OpenAI, clip: bytes) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.audio.transcriptions.create(file=("clip.wav", b"RIFF but not audio"), model="tiny-omni")
    assert bad.value.body["param"] == "file" and bad.value.body["code"] == "invalid_audio"
    with pytest.raises(openai.BadRequestError) as bad:
        client.audio.transcriptions.create(file=("clip.wav", clip), model="tiny-omni", response_format="docx")
    assert bad.value.body["param"] == "response_format"
    with pytest.raises(openai.NotFoundError) as missing:
        client.audio.transcriptions.create(file=("clip.wav", clip), model="whisper-1")
    assert missing.value.body["param"] == "model"
