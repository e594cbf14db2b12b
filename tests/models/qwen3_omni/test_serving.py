"""Qwen3-Omni served over HTTP by the full runtime, against transformers' thinker.generate on the same weights.

One server per module: the checkpoint transformers' own ``save_pretrained``
wrote (plus the tiny tokenizer and processor configs), on the
``qwen3-omni-encoders-split`` placement (the encoders on rank 1, so their
tokens and deepstack features cross ranks). Requests that mix modalities
(text only, audio, image, a video file, video frames, audio + image + text)
run concurrently, some joining while others decode; each greedy answer must
be the reference's, token for token. The reference's inputs come from our
processor on the same decoded media (its equality with the checkpoint's
processor is tested in test_prompt.py).
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import torch

from tests.api.real_server import in_thread_server
from tests.models.qwen3_omni.conftest import hf_inputs, rgb, wave
from walkserve.api.media.audio_decode import decode_audio
from walkserve.api.media.image_codec import decode_image
from walkserve.core.config import RuntimeConfig
from walkserve.models.qwen3_omni.processor import (
    RECOMMENDED_SYSTEM_PROMPT,
    OmniParams,
    Qwen3OmniProcessor,
)
from walkserve.models.qwen3_omni.tiny import PREPROCESSOR, VIDEO_PREPROCESSOR
from walkserve.models.qwen3_omni.tiny_tokenizer import TOKEN_IDS, write_tiny_tokenizer
from walkserve.placements import path as placement_path

pytestmark = [pytest.mark.slow, pytest.mark.parity]
MAX_TOKENS = 8
STOP = [TOKEN_IDS["<|im_end|>"], TOKEN_IDS["<|endoftext|>"]]


@pytest.fixture(scope="module")
def served_dir(hf_dir, tmp_path_factory):
    """transformers' save_pretrained output, with the tokenizer and processor files a release ships."""
    out = tmp_path_factory.mktemp("omni_served") / "tiny-omni"
    shutil.copytree(hf_dir, out)
    write_tiny_tokenizer(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (out / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": STOP}))
    return out


@pytest.fixture(scope="module")
def server(served_dir):
    with in_thread_server("qwen3-omni", served_dir, RuntimeConfig(max_running=16),
                          placement=str(placement_path("qwen3-omni-encoders-split")),
                          max_media_parts=4, max_audio_seconds=3.0) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


# -- media as clients send them -------------------------------------------------------------------
def png_url(image: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def wav_b64(samples: np.ndarray, rate: int = 16000) -> str:
    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="WAV", subtype="FLOAT")
    return base64.b64encode(buffer.getvalue()).decode()


def jpeg_frames_url(frames: list[np.ndarray]) -> str:
    from PIL import Image

    parts = []
    for f in frames:
        buffer = io.BytesIO()
        Image.fromarray(f).save(buffer, format="JPEG", quality=95)
        parts.append(base64.b64encode(buffer.getvalue()).decode())
    return "data:video/jpeg;base64," + ",".join(parts)


def mp4_bytes(frames: list[np.ndarray], fps: int = 4) -> bytes:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        for f in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


AUDIO = wave(1.37, seed=1)  # 137 mel frames: a full 100-frame chunk and a tail
IMAGE = rgb(70, 100, seed=2)
FRAMES = [rgb(64, 64, seed=10 + i) for i in range(4)]
VIDEO = mp4_bytes([rgb(64, 96, seed=20 + i) for i in range(8)])  # 2 s at 4 fps -> 4 frames at 2 fps


def _parts() -> dict[str, dict]:
    return {
        "audio": {"type": "input_audio", "input_audio": {"data": wav_b64(AUDIO), "format": "wav"}},
        "image": {"type": "image_url", "image_url": {"url": png_url(IMAGE)}},
        "frames": {"type": "video_url", "video_url": {"url": jpeg_frames_url(FRAMES), "fps": 1.5}},  # fractional times
        "video": {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(VIDEO).decode()}},
    }


def _text(t: str) -> dict:
    return {"type": "text", "text": t}


def cases() -> dict[str, list[dict]]:
    p = _parts()
    return {
        "text": [{"role": "system", "content": RECOMMENDED_SYSTEM_PROMPT}, {"role": "user", "content": "Hi there"}],
        "audio": [{"role": "user", "content": [p["audio"], _text("What was said?")]}],
        "image": [{"role": "user", "content": [p["image"], _text("Describe it")]}],
        "video": [{"role": "user", "content": [p["video"], _text("What happens?")]}],
        "frames": [{"role": "user", "content": [_text("Watch:"), p["frames"]]}],
        "mixed": [{"role": "system", "content": "Be brief"},
                  {"role": "user", "content": [p["audio"], _text("and"), p["image"], _text("together?")]}],
    }


def decoded(messages: list[dict]) -> list[dict]:
    """The messages as the API hands them to the processor (media decoded as the server decodes them)."""
    out = []
    for m in messages:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        parts = []
        for part in m["content"]:
            if part["type"] == "image_url":
                raw = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                parts.append({"type": "image", "image": decode_image(raw, 1 << 30, "p")})
            elif part["type"] == "input_audio":
                audio, rate = decode_audio(base64.b64decode(part["input_audio"]["data"]), 60.0, "p")
                parts.append({"type": "audio", "audio": audio, "sample_rate": rate})
            elif part["type"] == "video_url":
                header, payload = part["video_url"]["url"].split(",", 1)
                if header.startswith("data:video/jpeg"):
                    frames = [decode_image(base64.b64decode(f), 1 << 30, "p") for f in payload.split(",")]
                    parts.append({"type": "video", "frames": frames, "fps": part["video_url"].get("fps")})
                else:
                    parts.append({"type": "video", "video": base64.b64decode(payload)})
            else:
                parts.append(part)
        out.append({**m, "content": parts})
    return out


def reference(hf_model, processor: Qwen3OmniProcessor, messages: list[dict], n: int = MAX_TOKENS,
              stop: tuple[int, ...] = (), min_tokens: int = 0) -> list[int]:
    """transformers' greedy answer, its stop token cut off (``stop``: ids that stop besides EOS)."""
    request, _ = processor.thinker_request("chat", {"messages": decoded(messages)}, OmniParams())
    eos = [*STOP, *stop]
    with torch.no_grad():
        out = hf_model.thinker.generate(**hf_inputs(request), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                                        pad_token_id=STOP[1], min_new_tokens=min_tokens)
    ids = out[0, len(request.input_ids):].tolist()
    return ids[:-1] if ids and ids[-1] in eos else ids


@pytest.fixture(scope="module")
def processor(served_dir) -> Qwen3OmniProcessor:
    return Qwen3OmniProcessor(served_dir)


def test_concurrent_mixed_modalities_equal_reference_generate(client, hf_model, processor):
    """Six requests of every kind at once, three joining while the first three decode: greedy tokens equal."""
    results: dict[str, object] = {}

    def ask(name: str, messages: list[dict]) -> None:
        results[name] = client.chat.completions.create(model="tiny-omni", messages=messages, max_tokens=MAX_TOKENS,
                                                       temperature=0.0, logprobs=True)

    all_cases = cases()
    first = [threading.Thread(target=ask, args=(n, all_cases[n])) for n in ("text", "video", "mixed")]
    for t in first:
        t.start()
    time.sleep(0.15)  # the rest join mid-flight
    rest = [threading.Thread(target=ask, args=(n, all_cases[n])) for n in ("audio", "image", "frames")]
    for t in rest:
        t.start()
    for t in first + rest:
        t.join(120)
    assert set(results) == set(all_cases)
    for name, messages in all_cases.items():
        want = reference(hf_model, processor, messages)
        got = results[name]
        choice = got.choices[0]
        assert choice.message.content == processor.decode(want), name
        assert got.usage.completion_tokens == len(want), name
        assert len(choice.logprobs.content) == len(want), name
        assert choice.finish_reason == ("length" if len(want) == MAX_TOKENS else "stop"), name


def test_logprobs_equal_reference_scores(client, hf_model, processor):
    messages = cases()["image"]
    request, _ = processor.thinker_request("chat", {"messages": decoded(messages)}, OmniParams())
    with torch.no_grad():
        out = hf_model.thinker.generate(**hf_inputs(request), max_new_tokens=3, do_sample=False, eos_token_id=STOP,
                                        pad_token_id=STOP[1], output_scores=True, return_dict_in_generate=True)
    want = [float(torch.log_softmax(s[0].float(), -1).max()) for s in out.scores]
    got = client.chat.completions.create(model="tiny-omni", messages=messages, max_tokens=3, temperature=0.0,
                                         logprobs=True, top_logprobs=2)
    entries = got.choices[0].logprobs.content
    assert [round(e.logprob, 4) for e in entries] == pytest.approx([round(w, 4) for w in want], abs=2e-4)
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == pytest.approx(e.logprob) for e in entries)


def test_streamed_chat_equals_reference(client, hf_model, processor):
    messages = cases()["mixed"]
    stream = client.chat.completions.create(model="tiny-omni", messages=messages, max_tokens=MAX_TOKENS,
                                            temperature=0.0, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == processor.decode(reference(hf_model, processor, messages))


def test_completions_and_generate_routes(server, hf_model, processor):
    """/v1/completions (a raw prompt, no template) and /v1/generate (a user turn with an image input)."""
    prompt = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    ids = processor.tokenize(prompt)
    with torch.no_grad():
        ref = hf_model.thinker.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                        max_new_tokens=6, do_sample=False, eos_token_id=STOP, pad_token_id=STOP[1])
    want = [t for t in ref[0, len(ids):].tolist() if t not in STOP]
    body = httpx.post(f"{server.url}/v1/completions", json={"prompt": prompt, "max_tokens": 6, "temperature": 0},
                      timeout=60).json()
    assert body["choices"][0]["text"] == processor.decode(want)

    native = {"inputs": {"image": {"type": "image", "url": png_url(IMAGE)}, "prompt": "Describe it"},
              "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0}, "stream": False}
    got = httpx.post(f"{server.url}/v1/generate", json=native, timeout=60).json()
    tokens = [t for e in got["outputs"] if e["modality"] == "text" for t in e["data"]["token_ids"]]
    assert tokens == reference(hf_model, processor, cases()["image"])  # the same user turn


def _ask(client, messages, **kw):
    return client.chat.completions.create(model="tiny-omni", messages=messages, **kw)


def test_first_token_edges(client, hf_model, processor):
    """Token 0 comes from the prefill: as a stop token (min_tokens 0) it ends the request unstreamed, with
    "stop"; with min_tokens 1 the stop ids are masked for token 0 (as transformers' min_new_tokens);
    max_tokens 1 runs no decode ("length"); a stop string in token 0 ends it too. Usage counts the prompt
    and what was streamed."""
    messages = cases()["audio"]
    want = reference(hf_model, processor, messages)
    t0 = want[0]
    request, _ = processor.thinker_request("chat", {"messages": decoded(messages)}, OmniParams())
    stopped = _ask(client, messages, max_tokens=MAX_TOKENS, temperature=0.0, logprobs=True,
                   extra_body={"stop_token_ids": [t0]})
    assert stopped.choices[0].message.content == "" and stopped.choices[0].finish_reason == "stop"
    assert (stopped.usage.prompt_tokens, stopped.usage.completion_tokens) == (len(request.input_ids), 0)
    late = _ask(client, messages, max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"stop_token_ids": [t0],
                                                                                       "min_tokens": 1})
    expected = reference(hf_model, processor, messages, stop=(t0,), min_tokens=1)
    assert expected[0] != t0 and late.choices[0].message.content == processor.decode(expected)
    assert late.usage.completion_tokens == len(expected)
    assert late.choices[0].finish_reason == ("length" if len(expected) == MAX_TOKENS else "stop")
    one = _ask(client, messages, max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=2)
    assert one.choices[0].message.content == processor.decode([t0]) and one.choices[0].finish_reason == "length"
    assert (one.usage.prompt_tokens, one.usage.completion_tokens) == (len(request.input_ids), 1)
    assert len(one.choices[0].logprobs.content) == 1 and len(one.choices[0].logprobs.content[0].top_logprobs) == 2
    text = processor.decode([t0])
    if text:  # a stop string inside token 0's text
        by_string = _ask(client, messages, max_tokens=MAX_TOKENS, temperature=0.0, stop=[text])
        assert by_string.choices[0].message.content == "" and by_string.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(client):
    """Token 0 is the request's seeded draw 0 (sampled in the prefill), the rest the decode's draws 1, 2, ..."""
    messages = cases()["image"]
    runs = [_ask(client, messages, max_tokens=MAX_TOKENS, temperature=1.0, top_p=0.9, seed=1234, logprobs=True)
            for _ in range(2)]
    a, b = (r.choices[0] for r in runs)
    assert a.message.content == b.message.content
    assert [e.logprob for e in a.logprobs.content] == [e.logprob for e in b.logprobs.content]
    assert runs[0].usage.completion_tokens == len(a.logprobs.content) > 0


@pytest.mark.parametrize(("content", "param"), [
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "messages[0].content[0].image_url.url"),
    ([{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAAAAAA"}}], "messages[0].content[0]"),
    ([{"type": "input_audio", "input_audio": {"data": wav_b64(wave(3.5)), "format": "wav"}}],
     "messages[0].content[0].input_audio.data"),
    ([{"type": "image_url", "image_url": {"url": png_url(rgb(8, 8))}}] * 5, "messages"),
    ([{"type": "video_url", "video_url": {"url": "data:video/jpeg;base64,"}}], "messages[0].content[0].video_url.url"),
])
def test_bad_media_is_a_400_naming_the_part(server, content, param):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": content}], "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_audio_only_out_is_refused_naming_modalities(server):
    """Spoken answers come with their transcript: modalities ["audio"] alone is a 400 (speech: test_speech_serving)."""
    r = httpx.post(f"{server.url}/v1/generate", timeout=60, json={"inputs": {"prompt": "Hi"}, "modalities": ["audio"],
                                                                  "stream": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "modalities", r.text
