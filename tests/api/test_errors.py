"""Invalid inputs of every kind get the right status and one error envelope; never a 5xx for a client's mistake."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from walkserve.core.sampling import SamplingParams
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig
from walkserve.testing.fake_processor import FakeProcessor

from .helpers import asgi_client, assert_envelope

BIG = 2**63
VALUES = {"-1": -1, "0": 0, "NaN": "NaN", "1e308": 1e308, "2**63": BIG}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "hi", "max_tokens": 2}

# field -> the probe values that are valid (everything else must be a 400 naming the field)
SAMPLING_VALID = {
    "max_tokens": set(),
    "temperature": {"0"},
    "top_p": set(),
    "top_k": {"0"},
    "min_p": {"0"},
    "repetition_penalty": set(),
    "presence_penalty": {"-1", "0"},
    "frequency_penalty": {"-1", "0"},
    "min_tokens": {"0"},
    "seed": {"0"},
    "n": set(),
}
CASES = (
    [("/v1/completions", COMPLETION, f, ok) for f, ok in SAMPLING_VALID.items()]
    + [("/v1/completions", COMPLETION, "logprobs", set()), ("/v1/completions", COMPLETION, "best_of", set())]
    + [("/v1/chat/completions", CHAT, f, ok) for f, ok in SAMPLING_VALID.items()]
    + [("/v1/chat/completions", CHAT, "max_completion_tokens", set()), ("/v1/chat/completions", CHAT, "top_logprobs", set())]
    + [("/v1/audio/speech", {"input": "hi"}, "speed", set()), ("/v1/audio/speech", {"input": "hi"}, "seed", {"0"}),
       ("/v1/audio/speech", {"input": "hi"}, "max_tokens", set())]
    + [("/v1/images/generations", {"prompt": "x", "size": "4x4"}, f, ok) for f, ok in (("n", set()), ("seed", {"0"}), ("steps", set()))]
)


def body_with(base: dict, field: str, label: str) -> str:
    """JSON text with ``field`` set to the probe value (NaN written as the bare token)."""
    value = VALUES[label]
    if label == "NaN":
        return json.dumps({**base, field: 0}).replace(f'"{field}": 0', f'"{field}": NaN')
    if field in ("min_tokens",):  # min_tokens must stay below max_tokens to be valid
        base = {**base, "max_tokens": 4}
    return json.dumps({**base, field: value})


@pytest.mark.parametrize(("route", "base", "field", "valid"), CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
async def test_numeric_fields(route: str, base: dict, field: str, valid: set[str]) -> None:
    async with asgi_client() as client:
        for label in VALUES:
            response = await client.post(route, content=body_with(base, field, label), headers={"content-type": "application/json"})
            if label in valid:
                assert response.status_code == 200, (field, label, response.text)
            else:
                assert_envelope(response, 400, param=field)


@pytest.mark.parametrize(
    "field", ["max_tokens", "temperature", "top_p", "seed", "min_p", "stop_token_ids"]
)
async def test_generate_sampling_numbers(field: str) -> None:
    async with asgi_client() as client:
        for label in ("NaN", "1e308", "2**63", "-1"):
            value = [VALUES[label]] if field == "stop_token_ids" and label != "NaN" else VALUES[label]
            text = json.dumps({"inputs": {"prompt": "hi"}, "sampling": {field: value if label != "NaN" else 0}})
            if label == "NaN":
                text = text.replace(f'"{field}": 0', f'"{field}": NaN')
            response = await client.post("/v1/generate", content=text, headers={"content-type": "application/json"})
            error = assert_envelope(response, 400)
            assert error["param"].startswith(f"sampling.{field}"), error


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b"null", b"  ", b'{"prompt": }', b'{"prompt": "a",}', b"[" * 100 + b"]" * 100,
     b'{"prompt": "\xff\xfe"}', b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", b'{"prompt": "x", "temperature": Infinity}'],
    ids=["truncated", "array", "null", "blank", "missing-value", "trailing-comma", "deep", "bad-utf8", "huge-int", "infinity"],
)
async def test_malformed_json(body: bytes) -> None:
    async with asgi_client() as client:
        response = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert_envelope(response, 400)


@pytest.mark.parametrize("content_type", [None, "text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded"])
async def test_wrong_content_type(content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    async with asgi_client() as client:
        request = client.build_request("POST", "/v1/chat/completions", content=json.dumps(CHAT).encode(), headers=headers)
        assert request.headers.get("content-type") == content_type
        assert_envelope(await client.send(request), 415, code="unsupported_media_type")
        response = await client.post("/v1/images/edits", json={"prompt": "x"})
        assert_envelope(response, 415)


async def test_wrong_types_name_the_field() -> None:
    async with asgi_client() as client:
        response = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": 5}]})
        assert assert_envelope(response, 400)["param"].startswith("messages[0].content")
        response = await client.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
        assert_envelope(response, 400, param="messages[0].role")
        response = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": "5"})
        assert_envelope(response, 400, param="max_tokens")
        response = await client.post("/v1/completions", json={"max_tokens": 5})
        assert_envelope(response, 400, param="prompt")
        response = await client.post("/v1/audio/speech", json={"input": "x", "stream_format": "video"})
        assert_envelope(response, 400, param="stream_format")


async def test_unknown_voice_and_format() -> None:
    async with asgi_client() as client:
        error = assert_envelope(await client.post("/v1/audio/speech", json={"input": "x", "voice": "bob"}), 400, param="voice")
        assert all(v in error["message"] for v in ("tara", "leo", "zoe"))
        error = assert_envelope(await client.post("/v1/audio/speech", json={"input": "x", "response_format": "aiff"}), 400, param="response_format")
        assert "wav" in error["message"] and "flac" in error["message"]
        chat_audio = {**CHAT, "modalities": ["text", "audio"], "audio": {"voice": "bob", "format": "wav"}}
        assert_envelope(await client.post("/v1/chat/completions", json=chat_audio), 400, param="audio.voice")
        chat_audio["audio"] = {"voice": "leo", "format": "xyz"}
        assert_envelope(await client.post("/v1/chat/completions", json=chat_audio), 400, param="audio.format")


async def test_unknown_model_route_and_method() -> None:
    async with asgi_client(model_aliases=("tiny",)) as client:
        assert_envelope(await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4"}), 404, param="model", code="model_not_found")
        assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "tiny"})).status_code == 200
        assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "fake-tiny"})).status_code == 200
        assert_envelope(await client.get("/v1/models/gpt-4"), 404, param="model")
        assert_envelope(await client.get("/v1/nothing"), 404, code="not_found")
        response = await client.get("/v1/chat/completions")
        assert_envelope(response, 405, code="method_not_allowed")
        assert "POST" in response.headers["allow"]


async def test_oversized_body() -> None:
    async with asgi_client(max_body_bytes=1000) as client:
        big = json.dumps({"prompt": "x" * 2000}).encode()
        assert_envelope(await client.post("/v1/completions", content=big, headers={"content-type": "application/json"}), 413)

        async def chunks():
            for _ in range(4):
                yield b" " * 400

        request = client.build_request("POST", "/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert "content-length" not in request.headers
        assert_envelope(await client.send(request), 413, code="body_too_large")
        small = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
        assert (await client.post("/v1/completions", content=small, headers={"content-type": "application/json"})).status_code == 200


def png_data_url(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (1, 2, 3)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_message(*urls: str) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in urls]}], "max_tokens": 2}


async def test_media_limits() -> None:
    async with asgi_client(max_media_parts=2, max_image_pixels=100) as client:
        small = png_data_url(5, 5)
        assert (await client.post("/v1/chat/completions", json=image_message(small))).status_code == 200
        assert_envelope(await client.post("/v1/chat/completions", json=image_message(small, small, small)), 400, code="too_many_media_parts")
        error = assert_envelope(await client.post("/v1/chat/completions", json=image_message(png_data_url(20, 20))), 400, code="image_too_large")
        assert error["param"] == "messages[0].content[0].image_url.url"
        assert_envelope(await client.post("/v1/chat/completions", json=image_message("data:image/png;base64,@@@")), 400, code="invalid_base64")
        not_image = "data:image/png;base64," + base64.b64encode(b"hello").decode()
        assert_envelope(await client.post("/v1/chat/completions", json=image_message(not_image)), 400, code="invalid_image")
        assert_envelope(await client.post("/v1/chat/completions", json=image_message("https://example.com/a.png")), 400, code="url_not_allowed")
        assert_envelope(await client.post("/v1/chat/completions", json=image_message("file:///etc/passwd")), 400)


async def test_an_image_past_pillows_bomb_threshold_is_too_large_not_undecodable() -> None:
    """A 108-megapixel photo is a real upload: over Pillow's decompression-bomb threshold (89 M pixels) it is
    refused as too large, like any image over max_image_pixels, not called unreadable."""
    buffer = io.BytesIO()
    Image.new("1", (12000, 9000)).save(buffer, format="PNG")  # 1 bit a pixel: a small file
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    async with asgi_client() as client:
        error = assert_envelope(await client.post("/v1/chat/completions", json=image_message(url)), 400,
                                code="image_too_large")
    assert "pixels" in error["message"]


def wav_base64(seconds: float, rate: int = 16000) -> str:
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(int(seconds * rate), np.float32), rate, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


async def test_audio_input_limits() -> None:
    async with asgi_client(max_audio_seconds=1.0) as client:
        def message(data: str) -> dict:
            return {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}], "max_tokens": 2}

        assert (await client.post("/v1/chat/completions", json=message(wav_base64(0.5)))).status_code == 200
        assert_envelope(await client.post("/v1/chat/completions", json=message(wav_base64(2.0))), 400, code="audio_too_long")
        assert_envelope(await client.post("/v1/chat/completions", json=message(base64.b64encode(b"RIFFxx").decode())), 400, code="invalid_audio")


async def test_capabilities_and_limits() -> None:
    text_only = FakeEngine(FakeEngineConfig(audio=False, images=False, image_in=False, max_context=64))
    async with asgi_client(text_only, max_n=2) as client:
        assert_envelope(await client.post("/v1/audio/speech", json={"input": "x"}), 400, code="unsupported_capability")
        assert_envelope(await client.post("/v1/images/generations", json={"prompt": "x"}), 400, code="unsupported_capability")
        assert_envelope(await client.post("/v1/chat/completions", json=image_message(png_data_url(2, 2))), 400, code="unsupported_capability")
        assert_envelope(await client.post("/v1/chat/completions", json={**CHAT, "n": 3}), 400, param="n")
        assert_envelope(await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 64}), 400, param="max_tokens")
        assert_envelope(await client.post("/v1/completions", json={"prompt": "x" * 80}), 400, param="prompt")
        assert_envelope(await client.post("/v1/chat/completions", json={**CHAT, "tools": [{"type": "function"}]}), 400, param="tools")
        # the fake model has no logprobs capability; top_logprobs alone is refused as OpenAI does
        no_logprobs = await client.post("/v1/completions", json={"prompt": "x", "logprobs": 2})
        assert_envelope(no_logprobs, 400, param="logprobs", code="unsupported_parameter")
        assert "fake-tiny" in no_logprobs.json()["error"]["message"]
        assert_envelope(await client.post("/v1/chat/completions", json={**CHAT, "logprobs": True}), 400, param="logprobs")
        assert_envelope(await client.post("/v1/chat/completions", json={**CHAT, "top_logprobs": 2}), 400, param="top_logprobs")
        bad_key = await client.post("/v1/completions", json={"prompt": "x", "logit_bias": {"abc": 1}})
        assert_envelope(bad_key, 400, param="logit_bias.abc")
        too_big = await client.post("/v1/chat/completions", json={**CHAT, "logit_bias": {"5": 101}})
        assert_envelope(too_big, 400, param="logit_bias")
        echo = await client.post("/v1/completions", json={"prompt": "x", "logprobs": 1, "echo": True})
        assert_envelope(echo, 400, param="logprobs", code="unsupported_parameter")  # prompt logprobs: same capability
        assert_envelope(await client.post("/v1/chat/completions", json={**CHAT, "stop": ["x" * 300]}), 400, param="stop")
        result = (await client.post("/v1/chat/completions", json={"messages": CHAT["messages"]})).json()
        assert result["usage"]["prompt_tokens"] + result["usage"]["completion_tokens"] <= 64


async def test_a_field_of_several_types_names_what_is_wrong_in_the_type_sent() -> None:
    async with asgi_client() as client:
        ids = assert_envelope(await client.post("/v1/completions", json={"prompt": [5, -1]}), 400, param="prompt[1]")
        assert "greater than or equal to 0" in ids["message"], ids  # not "prompt: should be a valid string"
        part = {"messages": [{"role": "user", "content": [{"type": "picture", "url": "x"}]}]}
        error = assert_envelope(await client.post("/v1/chat/completions", json=part), 400, param="messages[0].content[0]")
        assert "picture" in error["message"] and "image_url" in error["message"], error
        vocabulary = assert_envelope(await client.post("/v1/completions", json={"prompt": [5, 10**9]}), 400,
                                     param="prompt")  # past the vocabulary: the field the client sent, not the processor's
        assert "token ids" in vocabulary["message"], vocabulary
        second = await client.post("/v1/completions", json={"prompt": [[5], [10**9]]})
        assert_envelope(second, 400, param="prompt[1]")
        wrong = assert_envelope(await client.post("/v1/completions", json={"prompt": 5}), 400, param="prompt")
        assert "valid string" in wrong["message"], wrong  # no type got further: the first one's error


async def test_min_tokens_above_max_tokens_is_refused() -> None:
    async with asgi_client() as client:
        for route, body in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", CHAT),
                            ("/v1/audio/speech", {"input": "x"}),
                            ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 4})):
            crossed = {**body, "min_tokens": 9} | ({} if "max_completion_tokens" in body else {"max_tokens": 4})
            assert_envelope(await client.post(route, json=crossed), 400, param="min_tokens")
        equal = await client.post("/v1/completions", json={"prompt": "x", "min_tokens": 4, "max_tokens": 4})
        assert equal.status_code == 200, equal.text


async def test_stream_options_without_streaming_are_refused() -> None:
    async with asgi_client() as client:
        for route, body in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", CHAT)):
            for stream in ({}, {"stream": False}):
                sent = {**body, **stream, "stream_options": {"include_usage": True}}
                error = assert_envelope(await client.post(route, json=sent), 400, param="stream_options")
                assert "stream" in error["message"], error
            plain = await client.post(route, json={**body, "stream": False, "stream_options": None})
            assert plain.status_code == 200, plain.text  # a null is no options


async def test_api_key() -> None:
    async with asgi_client(api_key="s3cret") as client:
        assert_envelope(await client.post("/v1/chat/completions", json=CHAT), 401, code="invalid_api_key")
        wrong = {"Authorization": "Bearer nope"}
        response = await client.post("/v1/chat/completions", json=CHAT, headers=wrong)
        assert_envelope(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"
        assert_envelope(await client.get("/v1/models", headers={"Authorization": "Basic s3cret"}), 401)
        right = {"Authorization": "Bearer s3cret"}
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=right)).status_code == 200
        assert (await client.get("/health")).status_code == 200


async def test_health_states() -> None:
    engine = FakeEngine(FakeEngineConfig())
    async with asgi_client(engine) as client:
        assert (await client.get("/health")).status_code == 200
        for state in ("starting", "draining"):
            engine.set_state(state)
            error = assert_envelope(await client.get("/health"), 503)
            assert state in error["message"]
            assert_envelope(await client.post("/v1/chat/completions", json=CHAT), 503)
        engine.set_state(None)
        engine.kill_worker(0)
        response = await client.get("/health")
        assert_envelope(response, 503)
        assert response.json()["workers"] == {"0": False}


async def test_queue_full_is_429_with_retry_after() -> None:
    import asyncio

    engine = FakeEngine(FakeEngineConfig(max_running=1, max_waiting=0, token_delay_s=0.05, retry_after_s=2.5))
    async with asgi_client(engine) as client:
        first = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 10}))
        while engine.stats().running == 0:
            await asyncio.sleep(0.005)
        for stream in (False, True):
            response = await client.post("/v1/completions", json={"prompt": "y", "max_tokens": 2, "stream": stream})
            assert_envelope(response, 429, code="server_busy")
            assert response.headers["retry-after"] == "3"
        assert (await first).status_code == 200


class ExplodingProcessor(FakeProcessor):
    def build_request(self, task, payload, sampling: SamplingParams, params):
        raise RuntimeError("boom in /srv/secret/module.py at 0x7fdeadbeef")


async def test_unexpected_errors_are_generic_500() -> None:
    engine = FakeEngine(FakeEngineConfig())
    engine._processor = ExplodingProcessor(engine.config.card())
    async with asgi_client(engine) as client:
        error = assert_envelope(await client.post("/v1/chat/completions", json=CHAT), 500, code="internal_error")
        assert "boom" not in error["message"] and "secret" not in error["message"]


async def test_runtime_failure_before_output_is_500_without_internals() -> None:
    from walkserve.testing.fake_engine import FAIL_MAGIC

    async with asgi_client() as client:
        response = await client.post("/v1/completions", json={"prompt": FAIL_MAGIC, "max_tokens": 50})
        error = assert_envelope(response, 500, code="request_failed")
        assert "injected" in error["message"]


async def test_metrics_count_client_errors() -> None:
    async with asgi_client() as client:
        await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
        text = (await client.get("/metrics")).text
        assert 'walkserve_http_client_errors_total{route="/v1/completions",status="400"} 1.0' in text
        assert 'walkserve_http_responses_total{route="/v1/completions",status="400"} 1.0' in text


async def test_image_edit_form_seed_is_a_number_in_text() -> None:
    """A multipart field is text: ``seed=7`` must reach the request as the integer 7 (and seed 8 for the 2nd image)."""
    seen = []

    class Recording(FakeEngine):
        def generate(self, request):
            seen.append(request.sampling.seed)
            return super().generate(request)

    buffer = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buffer, format="PNG")
    files = {"image": ("a.png", buffer.getvalue(), "image/png")}
    async with asgi_client(Recording(FakeEngineConfig(images=True))) as client:
        response = await client.post("/v1/images/edits", data={"prompt": "x", "seed": "7", "n": "2"}, files=files)
    assert response.status_code == 200, response.text
    assert seen == [7, 8]


def test_httpx_is_the_transport() -> None:
    assert httpx.__version__  # the tests above run the app in-process through httpx.ASGITransport


@pytest.mark.parametrize(("field", "value"), [("n", "-1"), ("n", "0"), ("n", "NaN"), ("n", "1e308"), ("n", str(BIG)),
                                              ("seed", "-1"), ("seed", "NaN"), ("seed", str(BIG)), ("size", "0x5"), ("size", "99999x99999")])
async def test_image_edit_form_fields(field: str, value: str) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buffer, format="PNG")
    async with asgi_client() as client:
        files = {"image": ("a.png", buffer.getvalue(), "image/png")}
        response = await client.post("/v1/images/edits", data={"prompt": "x", field: value}, files=files)
        assert_envelope(response, 400, param=field)
        ok = await client.post("/v1/images/edits", data={"prompt": "x"}, files=files)
        assert ok.status_code == 200
