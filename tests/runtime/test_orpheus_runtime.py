"""Orpheus TTS served by real worker processes on the shipped placements, against the offline loop.

One tiny random-weight checkpoint (lm/ + snac/) per module; both shipped
placements (``orpheus-colocated``: lm and codec on one rank; ``orpheus-split``:
lm on rank 0, codec on rank 1) serve the same concurrent requests, greedy and
seeded. The codec seeds its noise per window and its kernels are batch- and
thread-invariant, so the two placements must agree bit for bit; the greedy
requests must also match ``orpheus_offline`` (transformers ``generate`` + the
``snac`` package) to float rounding.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import walkserve.placements
from tests.runtime.conftest import wait_until
from walkserve.core.config import RuntimeConfig
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.entrypoint.sync import Engine, RequestResult
from walkserve.models.base import ModelRef
from walkserve.models.orpheus.emission import request_seed
from walkserve.models.orpheus.tiny import write_tiny_orpheus
from walkserve.models.registry import load_model
from walkserve.testing import orpheus_offline as offline
from walkserve.transport import shm

PLACEMENTS = ("orpheus-colocated", "orpheus-split")
FRAME_TOKENS, FRAME_SAMPLES = 7, 2048
TEXTS = (
    "Hello there, how are you today?",
    "The river ran quietly past the mill.",
    "One, two, three, four.",
    "A short one.",
    "Please read this sentence aloud slowly.",
    "Good night, and sleep well.",
)
STREAM_TOKENS = 210  # 30 frames: 27 windows, then the final chunk


@pytest.fixture(scope="module")
def orpheus_dir(tmp_path_factory):
    return write_tiny_orpheus(tmp_path_factory.mktemp("orpheus_runtime"), lm="tiny", snac="tiny", seed=3)


@pytest.fixture(scope="module")
def processor(orpheus_dir):
    return load_model(ModelRef("orpheus", str(orpheus_dir))).processor()


@pytest.fixture(scope="module")
def requests(processor):
    """Three greedy requests (one without a seed: its noise comes from its id) and three sampled with seeds."""
    specs = []
    for i, text in enumerate(TEXTS):
        greedy = i < 3
        sampling = processor.sampling(
            temperature=0.0 if greedy else 0.6, max_tokens=40 + 7 * i, seed=None if i == 0 else 100 + i
        )
        specs.append(processor.build_request("speech", {"input": text, "voice": processor.voices[i]}, sampling, processor.check_params({})))
    return specs


@pytest.fixture(scope="module")
def engines(orpheus_dir):
    started = {}
    try:
        for name in PLACEMENTS:
            started[name] = Engine.start(
                "orpheus", placement=str(walkserve.placements.path(name)), config=RuntimeConfig(),
                model_path=str(orpheus_dir),
            )
        yield started
    finally:
        for engine in started.values():
            engine.close(drain_s=0)


@pytest.fixture(scope="module")
def served(engines, requests) -> dict[str, list[RequestResult]]:
    return {name: engine.run(requests, timeout=120) for name, engine in engines.items()}


def audio_of(events: list[OutputEvent]) -> np.ndarray:
    ordered = sorted(events, key=lambda e: e.index)
    assert [e.index for e in ordered] == list(range(len(ordered)))
    return np.concatenate([np.frombuffer(e.data.data, e.data.dtype) for e in ordered])


def test_shipped_placements_give_identical_audio(served, requests):
    colocated, split = served["orpheus-colocated"], served["orpheus-split"]
    for spec, a, b in zip(requests, colocated, split, strict=True):
        assert a.rejected is None and b.rejected is None
        assert a.finished.error is None and b.finished.error is None, (a.finished, b.finished)
        assert a.finished.reason == b.finished.reason
        assert {e.modality for e in a.events} == {"audio"}
        wave_a, wave_b = audio_of(a.events), audio_of(b.events)
        assert wave_a.dtype == np.float32 and np.abs(wave_a).max() > 0.01
        if a.finished.reason == FinishReason.LENGTH:
            assert wave_a.shape == ((spec.sampling.max_tokens // FRAME_TOKENS) * FRAME_SAMPLES,)
        np.testing.assert_array_equal(wave_a, wave_b, err_msg=f"{spec.id}: placements disagree")


@pytest.mark.parity
def test_greedy_requests_match_the_offline_loop(served, requests, orpheus_dir):
    torch.set_num_threads(1)
    lm, snac = offline.load_lm(orpheus_dir / "lm"), offline.load_snac(orpheus_dir / "snac")
    greedy = [(i, spec) for i, spec in enumerate(requests) if spec.sampling.temperature == 0.0]
    assert len(greedy) == 3
    for i, spec in greedy:
        s = spec.sampling
        want = offline.offline_speech(
            lm, snac, spec.inputs["prompt_token_ids"].tolist(), s.max_tokens, s.stop_token_ids,
            request_seed(spec.id, s.seed), repetition_penalty=s.repetition_penalty,
        )
        assert len(want.tokens) >= 28  # at least one regular window plus the final chunk
        got = served["orpheus-split"][i]
        assert got.finished.reason == (FinishReason.STOP if want.stopped else FinishReason.LENGTH)
        wave = torch.from_numpy(audio_of(got.events).copy())
        assert wave.shape == ((len(want.tokens) // FRAME_TOKENS) * FRAME_SAMPLES,)
        torch.testing.assert_close(wave, want.audio, rtol=1e-4, atol=2e-5)


def test_audio_streams_while_the_lm_is_still_decoding(engines, processor):
    spec = processor.build_request(
        "speech", {"input": "This one is long enough for many windows of audio.", "voice": "leo"},
        processor.sampling(temperature=0.0, max_tokens=STREAM_TOKENS, seed=5), processor.check_params({}),
    )
    arrivals: list[tuple[float, OutputEvent | RequestFinished]] = []
    start = time.monotonic()
    for out in engines["orpheus-split"].stream(spec, timeout=120):
        arrivals.append((time.monotonic() - start, out))
    (t_end, finished), audio = arrivals[-1], [(t, e) for t, e in arrivals[:-1]]
    assert isinstance(finished, RequestFinished) and finished.reason == FinishReason.LENGTH, finished
    frames = STREAM_TOKENS // FRAME_TOKENS
    assert len(audio) == frames - 3 + 1  # one event per regular window, then the final chunk
    assert audio_of([e for _, e in audio]).shape == (frames * FRAME_SAMPLES,)
    t_first = audio[0][0]
    # the first window needs 28 of 210 tokens: its audio must come well before decoding ends
    assert t_first < 0.5 * t_end, (t_first, t_end)
    assert sum(t < 0.75 * t_end for t, _ in audio) >= len(audio) // 2, [round(t, 3) for t, _ in audio]
    assert finished.timings["first_output_s"] < 0.5 * finished.timings["total_s"], finished.timings


def test_state_is_released_and_shared_memory_returns_to_baseline(engines, served):
    assert all(r.finished is not None for results in served.values() for r in results)
    for name, engine in engines.items():
        stats = wait_until(lambda e=engine: (s := e.stats()).running == 0 and s.requests_with_state == 0 and s)
        assert stats, f"{name}: requests still hold state: {engine.stats()}"
        assert stats.failed == 0 and stats.waiting == 0
    runs = {name: engine.engine.spec.run_id for name, engine in engines.items()}
    for engine in engines.values():
        engine.close(drain_s=0)
    for name, run_id in runs.items():
        assert wait_until(lambda r=run_id: not shm.segments(r)), f"{name}: left {shm.segments(run_id)[:5]}"
