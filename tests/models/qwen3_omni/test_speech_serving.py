"""Spoken answers served over HTTP on two ranks, against transformers' generate(return_audio=True), greedy.

One server per module on ``qwen3-omni-split`` (thinker on rank 0; talker,
code predictor and Code2Wav on rank 1, so thinker tokens stream across
ranks) over the speech reference checkpoint (speech_oracle.py). Several
requests run at once: spoken answers to a text prompt, to an audio + image
prompt, and a text-only answer. With temperature 0 here and
``talker_do_sample=False, talker_repetition_penalty=1.0`` there, the thinker
tokens and all 16 codes of every frame are identical, and the streamed
waveform equals the reference's whole decode within 2e-3 of its peak, with
its exact length.

The reference drops the thinker's last token when it stops at max_tokens
(research §1.7); we speak it, so the reference runs one thinker token more
and its first MAX_TOKENS tokens are compared.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading

import httpx
import numpy as np
import openai
import pytest
import torch

from tests.api.real_server import in_thread_server, metric, metrics, wait_for
from tests.models.qwen3_omni.conftest import hf_inputs, rgb, wave
from tests.models.qwen3_omni.speech_oracle import IM_END, generate_codes, reference, text_prompt
from tests.models.qwen3_omni.test_serving import decoded, png_url, wav_b64
from walkserve.core.config import RuntimeConfig
from walkserve.models.qwen3_omni.processor import OmniParams, Qwen3OmniProcessor
from walkserve.models.qwen3_omni.tiny import PREPROCESSOR, VIDEO_PREPROCESSOR
from walkserve.models.qwen3_omni.tiny_tokenizer import write_tiny_tokenizer
from walkserve.placements import path as placement_path

pytestmark = [pytest.mark.slow, pytest.mark.parity]
MAX_TOKENS, FRAMES = 8, 30  # 30 frames: two Code2Wav chunks (25 + the flushed 5)


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("omni_speech") / "tiny-omni-speech"
    shutil.copytree(reference().path, out)
    write_tiny_tokenizer(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (out / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR))
    return out


@pytest.fixture(scope="module")
def server(served_dir):
    with in_thread_server("qwen3-omni", served_dir, RuntimeConfig(max_running=8),
                          placement=str(placement_path("qwen3-omni-split"))) as s:
        yield s


@pytest.fixture(scope="module")
def text_reference():
    return generate_codes(text_prompt(), {}, MAX_TOKENS + 1, FRAMES + 1)


def native(server, ids: list[int], audio: bool = True, **params) -> list[dict]:
    body = {"inputs": {"prompt_token_ids": ids}, "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0},
            "modalities": ["text", "audio"] if audio else ["text"], "audio_encoding": "float32",
            "params": {"max_audio_frames": FRAMES, "codec_frames": True, **params}}
    with httpx.stream("POST", f"{server.url}/v1/generate", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line) for line in r.iter_lines() if line]


def _array(data: dict, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data["data"]), dtype=dtype)


def parts(events: list[dict]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(text token ids, frames [F, 16], waveform float32) of one NDJSON answer."""
    text, frames, audio = [], [], []
    for e in events:
        if e["type"] != "output":
            continue
        if e["modality"] == "text":
            text += e["data"]["token_ids"]
        elif e["modality"] == "latent":
            frames.append(_array(e["data"], np.int64).reshape(16))
        elif e["modality"] == "audio":
            assert e["data"]["sample_rate"] == 24000
            audio.append(_array(e["data"], "<f4"))
    wave = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    return text, torch.tensor(np.stack(frames)) if frames else torch.zeros(0, 16), torch.from_numpy(wave.copy())


def spoken(ref_tokens: list[int]) -> list[int]:
    """What we answer (and speak) where the reference ran MAX_TOKENS + 1 thinker tokens."""
    return (ref_tokens[:-1] if ref_tokens and ref_tokens[-1] == IM_END else ref_tokens)[:MAX_TOKENS]


def assert_wave_equal(wave: torch.Tensor, ref_wave: torch.Tensor, quantum: float = 0.0):
    assert wave.shape == ref_wave.shape  # 1920 F - 555 samples: the reference's whole decode
    assert float((wave - ref_wave).abs().max()) <= 2e-3 * float(ref_wave.abs().max()) + quantum


def assert_speech_equal(got, want):
    (tokens, frames, wave), (ref_tokens, ref_codes, ref_wave) = got, want
    assert tokens == spoken(ref_tokens)
    assert frames.shape == ref_codes.shape and torch.equal(frames, ref_codes)
    assert_wave_equal(wave, ref_wave)


AUDIO, IMAGE = wave(1.37, seed=1), rgb(70, 100, seed=2)
MIXED = [{"role": "system", "content": "Be brief"},
         {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav_b64(AUDIO), "format": "wav"}},
                                      {"type": "text", "text": "and"},
                                      {"type": "image_url", "image_url": {"url": png_url(IMAGE)}},
                                      {"type": "text", "text": "together?"}]}]


@pytest.fixture(scope="module")
def mixed_reference(served_dir):
    """transformers' spoken answer (Chelsie) to the audio + image chat, from our processor's decoded inputs."""
    request, _ = Qwen3OmniProcessor(served_dir).thinker_request("chat", {"messages": decoded(MIXED)}, OmniParams())
    extra = {k: v for k, v in hf_inputs(request).items() if k not in ("input_ids", "attention_mask")}
    return generate_codes(torch.tensor([request.input_ids]), extra, MAX_TOKENS + 1, FRAMES + 1, speaker="Chelsie")


def pcm16(data: str) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(data), "<i2").astype(np.float32) / 32768.0)


def test_concurrent_spoken_answers_equal_generate(server, served_dir, text_reference, mixed_reference):
    """Four requests at once: spoken answers (native with frames, chat whole, chat streamed) and a text answer."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    audio = {"voice": "Chelsie", "max_frames": FRAMES}
    results: dict[str, object] = {}
    before = metrics(server.url)

    def chat(name: str, stream: bool, fmt: str, modalities=("text", "audio")) -> None:
        kw = dict(modalities=list(modalities), audio={**audio, "format": fmt}) if "audio" in modalities else {}
        results[name] = client.chat.completions.create(model="tiny-omni-speech", messages=MIXED, temperature=0.0,
                                                       max_tokens=MAX_TOKENS, stream=stream, **kw)
        if stream:
            results[name] = list(results[name])

    jobs = [threading.Thread(target=lambda: results.__setitem__("native", native(server, text_prompt()[0].tolist()))),
            threading.Thread(target=chat, args=("whole", False, "wav")),
            threading.Thread(target=chat, args=("streamed", True, "pcm16")),
            threading.Thread(target=chat, args=("text", False, "wav", ("text",)))]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join(300)
    assert set(results) == {"native", "whole", "streamed", "text"}
    assert_speech_equal(parts(results["native"]), text_reference)

    processor = Qwen3OmniProcessor(served_dir)
    ref_tokens, ref_codes, ref_wave = mixed_reference
    transcript = processor.decode(spoken(ref_tokens))
    whole = results["whole"]
    message = whole.choices[0].message
    assert message.audio.transcript == transcript and message.content is None
    import io

    import soundfile as sf

    samples, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="float32")
    assert rate == 24000
    assert_wave_equal(torch.from_numpy(samples), ref_wave, quantum=1 / 32768)
    assert whole.usage.completion_tokens_details.audio_tokens == ref_codes.shape[0]  # one per codec frame

    chunks = [c.choices[0].delta for c in results["streamed"] if c.choices]
    deltas = [d.audio.model_dump() if getattr(d, "audio", None) else {} for d in chunks]
    assert "".join(a.get("transcript") or "" for a in deltas) == transcript
    assert_wave_equal(torch.cat([pcm16(a["data"]) for a in deltas if a.get("data")]), ref_wave, quantum=1 / 32768)
    assert results["text"].choices[0].message.content == transcript  # text out: only the thinker runs

    # The streamed spoken answer was a real-time stream (admitted by capacity, played by the clock); the rest not.
    route = "/v1/chat/completions"
    after = metrics(server.url)
    assert metric(after, "walkserve_audio_streams_admitted_total", route=route) - metric(
        before, "walkserve_audio_streams_admitted_total", route=route) == 1
    assert metric(after, "walkserve_audio_streams_ended_total", route=route) - metric(
        before, "walkserve_audio_streams_ended_total", route=route) == 1
    assert metric(after, "walkserve_audio_streams_active", route=route) == 0
    assert wait_for(lambda: metric(metrics(server.url), "walkserve_streams_admitted_total") >= 1, 10)


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"audio": {"voice": "Nobody", "format": "wav"}}, "audio.voice", "Ethan, Aiden, Chelsie"),
    ({"audio": {"voice": "ethan", "format": "mp3"}, "stream": True}, "audio.format", "pcm16"),
    ({"audio": {"voice": "ethan", "format": "wav"}, "max_tokens": 1}, "max_tokens", ">= 2"),
    ({"audio": {"voice": "ethan", "format": "wav", "node_sampling": {"vocoder": {}}}}, "node_sampling", "talker"),
    ({"audio": None}, "audio", "voice"),
])
def test_bad_speech_requests_are_400s_naming_the_field(server, body, param, needle):
    payload = {"messages": [{"role": "user", "content": "Hi"}], "modalities": ["text", "audio"], **body}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=payload, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and needle in error["message"], error


def test_a_stop_token_first_ends_a_spoken_answer_unsaid(server, mixed_reference):
    """Token 0 a stop token (min_tokens 0): nothing streamed, nothing counted, nothing spoken, finish "stop"."""
    t0 = int(mixed_reference[0][0])
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    audio = {"voice": "Chelsie", "max_frames": FRAMES, "format": "pcm16"}
    whole = client.chat.completions.create(model="tiny-omni-speech", messages=MIXED, temperature=0.0,
                                           max_tokens=MAX_TOKENS, modalities=["text", "audio"],
                                           audio={**audio, "format": "wav"}, extra_body={"stop_token_ids": [t0]})
    choice = whole.choices[0]
    assert choice.finish_reason == "stop" and whole.usage.completion_tokens == 0
    assert not choice.message.content and not (choice.message.audio and choice.message.audio.transcript)
    streamed = list(client.chat.completions.create(model="tiny-omni-speech", messages=MIXED, temperature=0.0,
                                                   max_tokens=MAX_TOKENS, modalities=["text", "audio"], audio=audio,
                                                   stream=True, extra_body={"stop_token_ids": [t0]}))
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    assert not any(d.content or (getattr(d, "audio", None) and (d.audio.get("transcript") if isinstance(d.audio, dict)
                                                                  else d.audio.transcript)) for d in deltas)
    assert [c.choices[0].finish_reason for c in streamed if c.choices and c.choices[0].finish_reason] == ["stop"]
