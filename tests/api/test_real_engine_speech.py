"""`walkserve serve` (the CLI, as a subprocess) serving the embedded tiny Orpheus, over the real runtime.

One server per module: started with no model, so it writes the embedded
random-weight checkpoint into a temporary WALKSERVE_CACHE_DIR, and with
``--default-max-tokens 71`` so a speech request makes 71 audio tokens: 10
complete frames (the 71st token completes none), 10 x 2048 samples at
24 kHz. The last test stops it with SIGTERM.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shlex
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

import httpx
import numpy as np
import openai
import pytest
import soundfile

from tests.api.real_server import (
    OutputReader,
    alive,
    descendants,
    free_port,
    metric,
    metrics,
    segments_of,
    start_cli,
    wait_for,
    wait_healthy,
)

pytestmark = pytest.mark.slow
MAX_TOKENS = 71
SAMPLES = (MAX_TOKENS // 7) * 2048  # complete frames x samples per frame
SEED = 11  # fixed, so the random LM's 71 tokens (and whether one is END_OF_SPEECH) never change
LONG_TOKENS = 561  # the `max_tokens` of streams that must still be running while the test acts (80 frames)
LONG_SAMPLES = (LONG_TOKENS // 7) * 2048
MODEL = "orpheus-tiny-random"
MP3_LEAD_IN = 1105  # LAME's encoder delay + the decoder's, in samples (no gapless header in a stream)
AAC_PRIMING = 1024  # FFmpeg's AAC encoder delay, decoded as leading samples


@dataclass
class Served:
    url: str
    process: Popen
    output: OutputReader
    cache: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    cache = tmp_path_factory.mktemp("walkserve-cache")
    port = free_port()
    # --admission count: these tests run several streamed answers at once on a shared machine and check audio,
    # not admission (a measured real-time capacity below their concurrency would answer some 429; that is
    # tests/api/test_stream_admission.py's subject)
    process = start_cli(["--port", str(port), "--default-max-tokens", str(MAX_TOKENS), "--drain-timeout", "30",
                         "--admission", "count"],
                        env={"WALKSERVE_CACHE_DIR": str(cache)})
    output = OutputReader(process)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, output, timeout=240)
        assert wait_for(lambda: "stop:" in output.text(), 10), output.text()
        yield Served(url, process, output, cache)
    finally:
        if process.poll() is None:
            for pid in descendants(process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.kill()
            process.wait(10)


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=120)


def decode(data: bytes, fmt: str) -> np.ndarray:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768
    if fmt == "aac":
        import av

        with av.open(io.BytesIO(data)) as container:
            return np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    assert rate == 24000
    return samples


def test_start_output_and_embedded_checkpoint(served):
    text = served.output.text()
    for expected in ("embedded demo", "RANDOM weights", "wrote the embedded checkpoint", "loading model",
                     "starting workers", "runtime ready in", "POST /v1/audio/speech", "out.wav"):
        assert expected in text, (expected, text)
    root = served.cache / "embedded"
    assert sorted(p.name for p in root.iterdir()) == [MODEL]  # no temporary directory left behind
    assert (root / MODEL / "lm" / "config.json").is_file() and (root / MODEL / "snac" / "model.safetensors").is_file()
    assert "Traceback" not in text


def test_the_printed_curl_line_works(served):
    [line] = [x for x in served.output.lines if x.strip().startswith("try:")]
    words = shlex.split(line.split("try:", 1)[1])
    assert words[:2] == ["curl", "-s"] and words[-2:] == ["-o", "out.wav"]
    url, body = words[2], json.loads(words[words.index("-d") + 1])
    assert url == f"{served.url}/v1/audio/speech"
    response = httpx.post(url, json={**body, "seed": SEED}, timeout=120)
    assert response.status_code == 200 and response.headers["content-type"] == "audio/wav"
    assert len(decode(response.content, "wav")) == SAMPLES


def test_models_say_random_weights(client):
    [model] = client.models.list().data
    extra = model.model_extra
    assert model.id == MODEL and extra["random_weights"] is True and extra["family"] == "orpheus"
    assert extra["sample_rate"] == 24000 and "tara" in extra["voices"]
    assert {"speech", "audio_out"} <= set(extra["capabilities"])


def test_every_audio_format_decodes_to_the_expected_samples(served, client):
    formats = httpx.get(f"{served.url}/v1/models", timeout=10).json()["data"][0]["audio_formats"]
    assert {"wav", "flac", "pcm"} <= set(formats)

    def speak(fmt: str) -> bytes:
        answer = client.audio.speech.create(model=MODEL, voice="tara", input="Hello there.", response_format=fmt,
                                            extra_body={"seed": SEED})
        return answer.content

    with ThreadPoolExecutor(len(formats) + 1) as pool:
        native = pool.submit(_native_audio, served.url)
        audio = dict(zip(formats, pool.map(speak, formats)))
    reference = native.result()
    assert len(reference) == SAMPLES and np.abs(reference).max() > 0
    for fmt, data in audio.items():
        samples = decode(data, fmt)
        if fmt == "mp3":  # streamed: LAME's lead-in, the audio, padding to whole 576-sample frames
            assert len(samples) == -(-(SAMPLES + MP3_LEAD_IN) // 576) * 576, len(samples)
            samples = samples[MP3_LEAD_IN : MP3_LEAD_IN + SAMPLES]
        if fmt == "aac":  # ADTS carries no edit list: the encoder's priming frame, the audio, whole 1024-sample frames
            assert len(samples) == -(-(SAMPLES + AAC_PRIMING) // 1024) * 1024, len(samples)
            samples = samples[AAC_PRIMING : AAC_PRIMING + SAMPLES]
        assert len(samples) == SAMPLES, (fmt, len(samples))
        if fmt in ("wav", "flac", "pcm"):  # lossless: the engine's audio, quantized to 16 bits
            np.testing.assert_allclose(samples, reference, atol=1.5 / 32768, err_msg=fmt)
        else:  # lossy (noise-like audio costs Opus most): still clearly the same signal; unrelated ones give ~0
            assert np.corrcoef(samples, reference)[0, 1] > 0.5, fmt


def _native_audio(url: str) -> np.ndarray:
    """The same speech through /v1/generate, as float32 samples (no encoder in between)."""
    body = {"task": "speech", "inputs": {"input": "Hello there.", "voice": "tara"}, "sampling": {"seed": SEED},
            "audio_encoding": "float32", "stream": False}
    answer = httpx.post(f"{url}/v1/generate", json=body, timeout=120).json()
    parts = [np.frombuffer(base64.b64decode(o["data"]["data"]), "<f4") for o in answer["outputs"]]
    return np.concatenate(parts)


def test_streamed_audio_arrives_before_the_request_ends(served):
    body = {"input": "Streaming now.", "voice": "tara", "response_format": "pcm", "seed": SEED, "max_tokens": LONG_TOKENS}
    arrivals: list[tuple[float, int]] = []
    start = time.monotonic()
    with httpx.stream("POST", f"{served.url}/v1/audio/speech", json=body, timeout=120) as response:
        assert response.status_code == 200
        for chunk in response.iter_raw():
            arrivals.append((time.monotonic() - start, len(chunk)))
    total = sum(n for _, n in arrivals)
    assert total == LONG_SAMPLES * 2
    # 80 frames arrive as they are decoded: many reads, the first long before the last (not one burst at the end)
    first, last = arrivals[0][0], arrivals[-1][0]
    assert len(arrivals) >= 10 and arrivals[0][1] < total / 4 and first < 0.5 * last, arrivals


def test_speech_max_tokens_bounds_the_audio(served):
    body = {"input": "Short.", "voice": "tara", "response_format": "pcm", "seed": SEED, "max_tokens": 14}
    response = httpx.post(f"{served.url}/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200 and len(response.content) == 2 * 2048 * 2  # two frames of s16 samples
    response = httpx.post(f"{served.url}/v1/audio/speech", json={**body, "max_tokens": 9000}, timeout=30)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "max_tokens" and "8192" in error["message"], error


def test_speech_metrics_move(served, client):
    before = metrics(served.url)
    # seeded: unseeded, the random LM may sample END_OF_SPEECH early and the answer is shorter than SAMPLES
    answer = client.audio.speech.create(model=MODEL, voice="tara", input="Count me.", response_format="wav",
                                        extra_body={"seed": SEED})
    samples = len(soundfile.read(io.BytesIO(answer.content), dtype="float32")[0])
    after = metrics(served.url)
    route = "/v1/audio/speech"
    for name in ("walkserve_time_to_first_audio_seconds_count", "walkserve_speech_real_time_factor_count",
                 "walkserve_e2e_request_latency_seconds_count"):
        assert metric(after, name, route=route) == metric(before, name, route=route) + 1, name
    assert metric(after, "walkserve_audio_output_seconds_total", route=route) == pytest.approx(
        metric(before, "walkserve_audio_output_seconds_total", route=route) + samples / 24000)
    assert 0 < samples <= SAMPLES
    assert metric(after, "walkserve_http_responses_total", route=route, status="200") > 0
    assert metric(after, "walkserve_kv_blocks_total") > 0


def test_disconnect_mid_stream_frees_runtime_state(served):
    """The request cannot end by itself before the client leaves: end-of-speech is masked for all its 8000
    tokens (min_tokens), so the disconnect must abort it, and its state must be freed at once."""
    body = {"input": "Leave early.", "voice": "tara", "response_format": "pcm", "max_tokens": 8000, "min_tokens": 8000}
    aborted, finished = _settled_outcomes(served.url)  # earlier tests' requests counted already
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{served.url}/v1/audio/speech", json=body) as response:
        assert response.status_code == 200
        busy = False
        for chunk in response.iter_raw():  # keep reading (the stream flows) until /metrics shows the run
            if chunk and _gauges(served.url, lambda used, state: used > 0 and state > 0):
                busy = True
                break
        assert busy, "KV blocks and request state should show in use while the stream runs"
    closed_at = time.monotonic()
    freed = wait_for(lambda: _gauges(served.url, lambda used, state: used == 0 and state == 0), 3, interval=0.02)
    took = time.monotonic() - closed_at
    assert freed and took < 1.0, f"runtime state freed after {took:.2f} s"
    outcome = wait_for(lambda: _moved(served.url, aborted, finished), 3, interval=0.05)
    assert outcome == (1, 0), outcome  # aborted, not finished


def _moved(url: str, aborted: float, finished: float) -> tuple[float, float] | None:
    """(aborted, finished) since the counts given, once either moved (/metrics lags the runtime by up to 0.25 s)."""
    now = metrics(url)
    moved = (metric(now, "walkserve_engine_requests_total", outcome="aborted") - aborted,
             metric(now, "walkserve_engine_requests_total", outcome="finished") - finished)
    return moved if any(moved) else None


def _settled_outcomes(url: str) -> tuple[float, float]:
    """(aborted, finished) once two reads 0.3 s apart agree: /metrics shows the runtime status of up
    to 0.25 s ago, which may not count a request an earlier test saw end yet."""
    def read() -> tuple[float, float]:
        now = metrics(url)
        return tuple(metric(now, "walkserve_engine_requests_total", outcome=o) for o in ("aborted", "finished"))

    last = read()
    for _ in range(10):
        time.sleep(0.3)
        now = read()
        if now == last:
            return now
        last = now
    raise AssertionError(f"request outcome counters kept moving: {last}")


def _gauges(url: str, test) -> bool:
    now = metrics(url)
    return test(metric(now, "walkserve_kv_blocks_used"), metric(now, "walkserve_requests_with_state"))


def test_sigterm_drains_then_exits_without_leftovers(served):
    """Last in the module: the in-flight stream completes, new work gets 503, every process exits, no shm left."""
    process = served.process
    children = descendants(process.pid)
    assert len(children) >= 3, children  # conductor, worker zygote, worker
    received: list[int] = []
    first = threading.Event()

    def consume() -> None:
        body = {"input": "Finish me.", "voice": "tara", "response_format": "pcm", "seed": SEED, "max_tokens": LONG_TOKENS}
        with httpx.stream("POST", f"{served.url}/v1/audio/speech", json=body, timeout=60) as response:
            for chunk in response.iter_raw():
                received.append(len(chunk))
                first.set()

    reader = threading.Thread(target=consume)
    reader.start()
    assert first.wait(30)
    process.send_signal(signal.SIGTERM)
    health = wait_for(lambda: _health_status(served.url) == 503, 5)
    assert health, "health should turn 503 while draining"
    refused = httpx.post(f"{served.url}/v1/audio/speech", json={"input": "late"}, timeout=5)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    reader.join(60)
    assert sum(received) == LONG_SAMPLES * 2  # the in-flight request finished whole
    assert process.wait(60) == 0
    served.output.join()
    assert "stopped: requests drained, runtime shut down" in served.output.text()
    assert wait_for(lambda: not [p for p in children if alive(p)], 5), [p for p in children if alive(p)]
    assert segments_of(process.pid) == []


def _health_status(url: str) -> int:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code
    except httpx.TransportError:
        return 0
