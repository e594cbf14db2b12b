"""The official openai client against a live server backed by the fake engine."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import soundfile as sf
from PIL import Image

from walkserve.testing.fake_engine import FakeEngine

MODEL = "fake-tiny"


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=30)


def expected_text(engine: FakeEngine, prompt: str) -> str:
    """What the fake writes for a completions prompt, decoded with its own processor."""
    import asyncio

    from walkserve.core.outputs import RequestFinished
    from walkserve.core.sampling import SamplingParams

    async def run() -> str:
        spec = engine.processor.build_request("completion", {"prompt": prompt}, SamplingParams(max_tokens=1000), engine.processor.check_params({}))
        ids = []
        async for event in engine.generate(spec):
            if not isinstance(event, RequestFinished):
                ids += event.data.tolist()
        return engine.processor.decode(ids)

    return asyncio.run(run())


def test_models_lists_the_card(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    extra = models[0].model_extra
    assert extra["random_weights"] is True
    assert "speech" in extra["capabilities"] and "chat" in extra["capabilities"]
    assert extra["voices"] == ["tara", "leo", "zoe"]


def test_completion_matches_the_engine(client: openai.OpenAI, engine: FakeEngine) -> None:
    want = expected_text(engine, "Once upon")
    result = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=1000)
    assert result.choices[0].text == want
    assert result.choices[0].finish_reason == "stop"
    assert result.usage.prompt_tokens == len(b"Once upon")
    assert result.usage.completion_tokens == len(want.encode())


def test_completion_stream_concatenates_to_the_same_text(client: openai.OpenAI, engine: FakeEngine) -> None:
    want = expected_text(engine, "Once upon")
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=1000, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completion_max_tokens_gives_length(client: openai.OpenAI) -> None:
    result = client.completions.create(model=MODEL, prompt=[72, 105], max_tokens=3)
    assert result.choices[0].finish_reason == "length"
    assert result.usage.completion_tokens == 3 and result.usage.prompt_tokens == 2


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi there"}])
    message = result.choices[0].message
    assert message.role == "assistant" and message.content
    assert result.choices[0].finish_reason == "stop"
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, seed=7)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, seed=7, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_n_choices_and_stop_string(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, seed=1).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = full[: full.index(stop)]
    result = client.chat.completions.create(model=MODEL, messages=messages, seed=1, n=2, stop=[stop])
    assert len(result.choices) == 2
    assert result.choices[0].message.content == cut
    assert result.choices[0].finish_reason == "stop"


def test_explicit_none_takes_the_default(client: openai.OpenAI) -> None:
    """The client types n, stream, echo (and images' output_format) as Optional and sends ``null`` for None; OpenAI
    reads that as unset."""
    messages = [{"role": "user", "content": "Hi there"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, seed=3, n=None, stream=None)
    assert len(chat.choices) == 1
    assert chat.choices[0].message.content == client.chat.completions.create(
        model=MODEL, messages=messages, seed=3).choices[0].message.content
    completion = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=3, n=None, echo=None, stream=None)
    assert len(completion.choices) == 1 and not completion.choices[0].text.startswith("Once upon")
    image = client.images.generate(model=MODEL, prompt="a red square", size="16x8", response_format="b64_json", n=None,
                                   output_format=None)
    assert len(image.data) == 1 and Image.open(io.BytesIO(base64.b64decode(image.data[0].b64_json))).format == "PNG"


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "pcm"])
def test_speech_formats_decode(client: openai.OpenAI, fmt: str) -> None:
    text = "Hello from the speech route, with enough words for several chunks."
    audio = client.audio.speech.create(model=MODEL, voice="leo", input=text, response_format=fmt).content
    if fmt == "pcm":
        samples = np.frombuffer(audio, dtype="<i2").astype(np.float32) / 32768
        rate = 24000
    else:
        samples, rate = sf.read(io.BytesIO(audio), dtype="float32")
    chunks = -(-len(text) // 8)
    assert rate == 24000
    assert abs(len(samples) - chunks * 2400) <= 3000, len(samples)  # codecs add a little padding
    spectrum = np.abs(np.fft.rfft(samples[: 24000 // 2]))
    assert abs(np.argmax(spectrum) * 2 - 440) <= 4  # voice "leo" is a 440 Hz tone


def test_speech_sse_stream(client: openai.OpenAI) -> None:
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, voice="tara", input="Stream me", response_format="pcm", stream_format="sse"
    ) as response:
        body = response.read().decode()
    events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    assert '"speech.audio.done"' in events[-1]
    import json

    audio = b"".join(base64.b64decode(json.loads(e)["audio"]) for e in events[:-1])
    assert len(audio) == 2 * 2400 * 2  # "Stream me" = 9 chars -> 2 chunks of 2400 samples, int16


def test_unknown_voice_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model=MODEL, voice="nobody", input="x")
    assert "tara" in info.value.message and info.value.body["param"] == "voice"


def test_images_generate_and_edit(client: openai.OpenAI) -> None:
    result = client.images.generate(model=MODEL, prompt="a red square", size="16x8", n=2, response_format="b64_json")
    assert len(result.data) == 2
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
    assert image.size == (16, 8) and image.format == "PNG"
    source = Image.new("RGB", (5, 4), (10, 20, 30))
    buffer = io.BytesIO()
    source.save(buffer, format="PNG")
    edited = client.images.edit(model=MODEL, image=("in.png", buffer.getvalue(), "image/png"), prompt="invert")
    out = np.asarray(Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json))))
    assert out.shape == (4, 5, 3) and tuple(out[0, 0]) == (245, 235, 225)


@pytest.mark.parametrize("route", ["generate", "edit"])
def test_images_with_stream_is_a_400_not_an_empty_stream(client: openai.OpenAI, route: str) -> None:
    """The server answers images whole: asked to stream (partial images), the openai package would read the JSON
    answer as an SSE stream of no events, so the server says it does not stream instead of answering."""
    with pytest.raises(openai.BadRequestError) as info:
        if route == "generate":
            client.images.generate(model=MODEL, prompt="a red square", size="16x8", stream=True, partial_images=1)
        else:
            buffer = io.BytesIO()
            Image.new("RGB", (5, 4)).save(buffer, format="PNG")
            client.images.edit(model=MODEL, image=("in.png", buffer.getvalue(), "image/png"), prompt="x", stream=True)
    assert (info.value.body["param"], info.value.body["code"]) == ("stream", "unsupported_parameter")
    assert len(client.images.generate(model=MODEL, prompt="a", size="16x8", extra_body={"stream": False}).data) == 1


def test_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.body["code"] == "model_not_found"


def test_error_mid_stream_is_one_event(client: openai.OpenAI) -> None:
    from walkserve.testing.fake_engine import FAIL_MAGIC

    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FAIL_MAGIC}], stream=True)
    received = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            received.append(chunk)
    assert received and "failed inside the runtime" in info.value.message
