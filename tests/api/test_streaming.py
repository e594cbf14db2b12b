"""Stream shapes: OpenAI SSE exactly, stop strings, errors inside a stream, audio deltas, native NDJSON."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import soundfile as sf
from PIL import Image

from walkserve.testing.fake_engine import FAIL_MAGIC, FakeEngine, FakeEngineConfig

from .helpers import asgi_client

CHAT = [{"role": "user", "content": "Say something"}]


def sse_events(text: str) -> list[str]:
    """The data payloads of an SSE body, in order; asserts the framing."""
    blocks = [b for b in text.split("\n\n") if b]
    assert text.endswith("\n\n")
    out = []
    for block in blocks:
        lines = block.split("\n")
        assert all(line.startswith(("data: ", "event: ")) for line in lines), block
        out.append("\n".join(line[6:] for line in lines if line.startswith("data: ")))
    return out


def engine(**kw) -> FakeEngine:
    return FakeEngine(FakeEngineConfig(audio=True, images=True, token_delay_s=0.0, **kw))


async def test_chat_sse_shape_with_usage() -> None:
    async with asgi_client(engine()) as client:
        body = {"messages": CHAT, "stream": True, "stream_options": {"include_usage": True}, "seed": 3}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
        content = [c for c in chunks[1:-2]]
        assert content and all(c["choices"][0]["finish_reason"] is None and c["usage"] is None for c in content)
        finish = chunks[-2]
        assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "stop"
        usage = chunks[-1]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(content)
        text = "".join(c["choices"][0]["delta"]["content"] for c in content)
        whole = (await client.post("/v1/chat/completions", json={"messages": CHAT, "seed": 3})).json()
        assert text == whole["choices"][0]["message"]["content"] and "\ufffd" not in text


async def test_stop_string_truncates_and_ends_the_request_as_finished() -> None:
    fake = engine()
    async with asgi_client(fake) as client:
        full = (await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 200})).json()["choices"][0]["text"]
        stop = full[5:9]
        for stream in (False, True):
            before = fake.stats()
            body = {"prompt": "abc", "max_tokens": 200, "stop": stop, "stream": stream}
            response = await client.post("/v1/completions", json=body)
            if stream:
                chunks = [json.loads(e) for e in sse_events(response.text)[:-1]]
                text = "".join(c["choices"][0]["text"] for c in chunks)
                reason = chunks[-1]["choices"][0]["finish_reason"]
            else:
                text, reason = response.json()["choices"][0]["text"], response.json()["choices"][0]["finish_reason"]
            assert text == full[: full.index(stop)] and reason == "stop"
            after = fake.stats()
            assert (after.finished - before.finished, after.aborted - before.aborted) == (1, 0)
            assert fake.active_requests == 0  # ended at once, not run to max_tokens


async def test_n_choices_stream_each_index() -> None:
    async with asgi_client(engine()) as client:
        body = {"prompt": ["one", "two"], "n": 2, "max_tokens": 4, "stream": True, "seed": 5}
        chunks = [json.loads(e) for e in sse_events((await client.post("/v1/completions", json=body)).text)[:-1]]
        texts: dict[int, str] = {}
        for chunk in chunks:
            choice = chunk["choices"][0]
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        assert sorted(texts) == [0, 1, 2, 3]
        assert sum(1 for c in chunks if c["choices"][0]["finish_reason"] == "length") == 4
        whole = (await client.post("/v1/completions", json={**body, "stream": False, "echo": True})).json()
        assert [c["text"][:3] for c in whole["choices"]] == ["one", "one", "two", "two"]
        assert whole["usage"]["prompt_tokens"] == 6 and whole["usage"]["completion_tokens"] == 16


async def test_a_prompts_choices_are_built_once_and_run_under_their_own_ids_and_seeds() -> None:
    """n choices of one prompt: the processor renders and tokenizes it once; each choice is its own request
    (its id) with its own seed (seed, seed + 1, ...), or none when the client gave none."""
    fake = engine()
    built, run = [], []
    build, generate = fake._processor.build_request, fake.generate

    def counted(task, payload, sampling, params):
        built.append(task)
        return build(task, payload, sampling, params)

    def recorded(request):
        run.append(request)
        return generate(request)

    fake._processor.build_request, fake.generate = counted, recorded
    async with asgi_client(fake) as client:
        for route, body in (("/v1/completions", {"prompt": ["one", "two"]}), ("/v1/chat/completions", {"messages": CHAT})):
            for seed in (5, None):
                built.clear()
                run.clear()
                sent = {**body, "n": 3, "max_tokens": 4} | ({"seed": seed} if seed is not None else {})
                answer = await client.post(route, json=sent)
                assert answer.status_code == 200, answer.text
                prompts = len(body.get("prompt", [None]))
                assert len(built) == prompts and len(run) == 3 * prompts, (route, built)
                assert len({r.id for r in run}) == 3 * prompts
                seeds = [r.sampling.seed for r in run]
                assert seeds == ([5, 6, 7] * prompts if seed is not None else [None] * 3 * prompts), seeds
                assert len(answer.json()["choices"]) == 3 * prompts


async def test_error_after_stream_started_is_one_event_then_done() -> None:
    async with asgi_client(engine()) as client:
        body = {"messages": [{"role": "user", "content": FAIL_MAGIC}], "stream": True}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        errors = [json.loads(e) for e in events[:-1] if "error" in json.loads(e)]
        assert len(errors) == 1 and errors[0]["error"]["code"] == "request_failed"
        assert set(errors[0]["error"]) == {"message", "type", "param", "code"}
        assert json.loads(events[-2]) == errors[0]


async def test_chat_audio_stream_and_collect() -> None:
    async with asgi_client(engine()) as client:
        body = {"messages": CHAT, "modalities": ["text", "audio"], "audio": {"voice": "zoe", "format": "pcm16"}, "stream": True, "seed": 2}
        chunks = [json.loads(e) for e in sse_events((await client.post("/v1/chat/completions", json=body)).text)[:-1]]
        audio_deltas = [c["choices"][0]["delta"]["audio"] for c in chunks if "audio" in c["choices"][0]["delta"]]
        ids = {d["id"] for d in audio_deltas}
        assert len(ids) == 1
        pcm = b"".join(base64.b64decode(d["data"]) for d in audio_deltas if "data" in d)
        transcript = "".join(d.get("transcript", "") for d in audio_deltas)
        assert len(pcm) % (2400 * 2) == 0 and len(pcm) > 0
        whole = (await client.post("/v1/chat/completions", json={**body, "stream": False, "audio": {"voice": "zoe", "format": "wav"}})).json()
        message = whole["choices"][0]["message"]
        assert message["content"] is None and message["audio"]["transcript"] == transcript
        samples, rate = sf.read(io.BytesIO(base64.b64decode(message["audio"]["data"])), dtype="int16")
        assert rate == 24000 and samples.tobytes() == pcm


async def test_speech_streams() -> None:
    async with asgi_client(engine()) as client:
        text = "twenty-four characters!!"
        wav = await client.post("/v1/audio/speech", json={"input": text, "response_format": "wav"})
        assert wav.headers["content-type"] == "audio/wav"
        assert wav.content[4:8] == b"\xff\xff\xff\xff"  # streamed: RIFF size unknown
        samples, rate = sf.read(io.BytesIO(wav.content), dtype="float32")
        assert len(samples) == 3 * 2400 and rate == 24000
        pcm = await client.post("/v1/audio/speech", json={"input": text, "response_format": "pcm"})
        assert pcm.content == wav.content[44:]
        mp3 = await client.post("/v1/audio/speech", json={"input": text, "response_format": "mp3"})
        decoded, _ = sf.read(io.BytesIO(mp3.content), dtype="float32")
        assert abs(len(decoded) - 7200) < 2400
        events = sse_events((await client.post("/v1/audio/speech", json={"input": text, "response_format": "pcm", "stream_format": "sse"})).text)
        parsed = [json.loads(e) for e in events]
        assert [e["type"] for e in parsed] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
        assert b"".join(base64.b64decode(e["audio"]) for e in parsed[:-1]) == pcm.content
        assert parsed[-1]["usage"]["output_tokens"] == 7200


async def test_native_generate_events() -> None:
    async with asgi_client(engine()) as client:
        body = {"inputs": {"prompt": "hey"}, "modalities": ["text", "latent"], "sampling": {"max_tokens": 50}}
        response = await client.post("/v1/generate", json=body)
        assert response.headers["content-type"] == "application/x-ndjson"
        events = [json.loads(line) for line in response.text.splitlines()]
        text_events = [e for e in events if e.get("modality") == "text"]
        assert [e["index"] for e in text_events] == list(range(len(text_events)))
        assert all(len(e["data"]["token_ids"]) == 1 for e in text_events)
        latent = next(e for e in events if e.get("modality") == "latent")["data"]
        values = np.frombuffer(base64.b64decode(latent["data"]), dtype=latent["dtype"]).reshape(latent["shape"])
        assert values.shape == (2, 3) and values[1, 2] == 2.5
        final = events[-1]
        assert final["type"] == "finished" and final["finish_reason"] == "stop"
        assert final["usage"]["completion_tokens"] == len(text_events) and "total" in final["timings"]
        whole = (await client.post("/v1/generate", json={**body, "stream": False})).json()
        assert "".join(e["data"]["text"] for e in whole["outputs"] if e["modality"] == "text") + whole["text"] == \
            "".join(e["data"]["text"] for e in text_events) + final["text"]


async def test_native_audio_and_image() -> None:
    async with asgi_client(engine()) as client:
        speech = {"task": "speech", "inputs": {"input": "hello"}, "params": {"voice": "tara"}, "audio_encoding": "float32"}
        events = [json.loads(line) for line in (await client.post("/v1/generate", json=speech)).text.splitlines()]
        audio = events[0]["data"]
        samples = np.frombuffer(base64.b64decode(audio["data"]), dtype="<f4")
        assert audio["encoding"] == "float32" and audio["sample_rate"] == 24000 and len(samples) == audio["samples"] == 2400
        assert abs(float(np.max(np.abs(samples))) - 0.3) < 0.01
        image = {"task": "image", "inputs": {"prompt": "dots"}, "params": {"size": [6, 4]}, "stream": False}
        result = (await client.post("/v1/generate", json=image)).json()
        data = result["outputs"][0]["data"]
        png = Image.open(io.BytesIO(base64.b64decode(data["data"])))
        assert data["format"] == "png" and data["shape"] == [4, 6, 3] and png.size == (6, 4)


async def test_native_array_input_and_stop() -> None:
    async with asgi_client(engine()) as client:
        ids = list(b"hey")
        array = {"type": "array", "dtype": "int64", "shape": [3], "data": base64.b64encode(np.array(ids, "<i8").tobytes()).decode()}
        by_ids = (await client.post("/v1/generate", json={"inputs": {"prompt_token_ids": array}, "stream": False})).json()
        by_text = (await client.post("/v1/generate", json={"inputs": {"prompt": "hey"}, "stream": False})).json()
        assert [e["data"]["token_ids"] for e in by_ids["outputs"]] == [e["data"]["token_ids"] for e in by_text["outputs"]]
        bad = {**array, "shape": [4]}
        response = await client.post("/v1/generate", json={"inputs": {"prompt_token_ids": bad}})
        assert response.status_code == 400 and response.json()["error"]["param"] == "inputs.prompt_token_ids"
        text = "".join(e["data"]["text"] for e in by_text["outputs"]) + by_text["text"]
        stop = text[3:6]
        stopped = (await client.post("/v1/generate", json={"inputs": {"prompt": "hey"}, "sampling": {"stop": [stop]}, "stream": False})).json()
        got = "".join(e["data"]["text"] for e in stopped["outputs"]) + stopped["text"]
        assert got == text[: text.index(stop)] and stopped["finish_reason"] == "stop"


async def test_native_route_checks_the_task_capability() -> None:
    text_only = FakeEngine(FakeEngineConfig(token_delay_s=0.0))
    async with asgi_client(text_only) as client:
        body = {"task": "completion", "inputs": {"prompt": "x"}, "sampling": {"max_tokens": 3}, "stream": False}
        done = (await client.post("/v1/generate", json=body)).json()
        assert done["finish_reason"] == "length" and len(done["outputs"]) == 3
        response = await client.post("/v1/generate", json={"task": "speech", "inputs": {"input": "x"}})
        assert response.status_code == 400 and response.json()["error"]["param"] == "task"
