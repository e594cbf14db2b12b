"""Spoken answers on ``qwen3-omni-3way`` (thinker, talker + code predictor, Code2Wav on three ranks), in process.

Greedy: the same tokens, codes and waveform as transformers (and so as the
split placement over HTTP, test_speech_serving.py). Sampled with a seed at
the card's defaults (thinker, talker and code predictor each sampling): the
same tokens and codes alone and beside other requests (the waveform to float
rounding: Code2Wav decodes equal chunks of several requests as one batch).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.qwen3_omni.speech_oracle import generate_codes, text_prompt
from tests.models.qwen3_omni.test_serving import decoded
from tests.models.qwen3_omni.test_speech_serving import (  # noqa: F401 (fixtures)
    FRAMES,
    MAX_TOKENS,
    MIXED,
    assert_speech_equal,
    mixed_reference,
    served_dir,
)
from walkserve.core.config import RuntimeConfig
from walkserve.core.sampling import SamplingParams
from walkserve.entrypoint.sync import Engine
from walkserve.placements import path as placement_path

pytestmark = [pytest.mark.slow, pytest.mark.parity]


@pytest.fixture(scope="module")
def engine(served_dir):  # noqa: F811
    with Engine.start("qwen3-omni", model_path=str(served_dir), config=RuntimeConfig(max_running=8),
                      placement=str(placement_path("qwen3-omni-3way"))) as e:
        yield e


def spec(engine, sampling: SamplingParams, frames: int = FRAMES):
    payload = {"inputs": {"prompt_token_ids": text_prompt()[0].tolist()}, "modalities": ["text", "audio"]}
    return engine.engine.processor.build_request("generate", payload, sampling, engine.engine.processor.check_params({"max_audio_frames": frames}))


def answer(result) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    values = lambda e: np.frombuffer(e.data.data, dtype=e.data.dtype)  # noqa: E731
    text = [int(e.data.item()) for e in result.modality("text")]
    frames = [torch.from_numpy(values(e).copy()).reshape(16) for e in result.modality("latent")]
    audio = [values(e) for e in result.modality("audio")]
    wave = torch.from_numpy(np.concatenate(audio).copy()) if audio else torch.zeros(0)
    return text, torch.stack(frames) if frames else torch.zeros(0, 16, dtype=torch.long), wave


def test_three_ranks_speak_as_generate(engine):
    want = generate_codes(text_prompt(), {}, MAX_TOKENS + 1, FRAMES + 1)
    result = engine.run([spec(engine, SamplingParams(max_tokens=MAX_TOKENS, temperature=0))])[0]
    assert_speech_equal(answer(result), want)


def test_seeded_sampling_is_reproducible_and_batch_invariant(engine):
    seeded = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.9, seed=7)
    alone = answer(engine.run([spec(engine, seeded, 12)])[0])
    crowd = engine.run([spec(engine, SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=1), 12),
                        spec(engine, seeded, 12), spec(engine, SamplingParams(max_tokens=4, temperature=0), 6)])
    again = answer(crowd[1])
    assert alone[0] == again[0] and torch.equal(alone[1], again[1])  # tokens and codes: bit for bit
    assert alone[2].shape == again[2].shape  # Code2Wav batches equal chunks of requests: float noise only
    assert float((alone[2] - again[2]).abs().max()) <= 1e-3 * float(alone[2].abs().max())
    other = answer(crowd[0])
    assert not torch.equal(other[1][: len(alone[1])], alone[1][: len(other[1])])  # another seed, another answer


def test_audio_and_image_prompt_codes_equal_generate(engine, mixed_reference):  # noqa: F811
    """The media pieces' talker rows (hidden_projection of the thinker's layer-3 input, 3-axis positions)."""
    payload = {"messages": decoded(MIXED), "modalities": ["text", "audio"]}
    spec = engine.engine.processor.build_request("chat", payload, SamplingParams(max_tokens=MAX_TOKENS, temperature=0),
                                                 engine.engine.processor.check_params({"voice": "chelsie", "max_audio_frames": FRAMES}))
    assert "talker_prefill_media" not in spec.inputs["walks"]  # the thinker's pieces; the talker's follow each
    assert_speech_equal(answer(engine.run([spec])[0]), mixed_reference)


def test_concurrent_answers_step_the_talker_as_one_cohort(engine):
    """Four greedy spoken answers at once: each talker frame and code-predictor step runs once for all of them."""
    def counts():
        nodes = engine.stats().nodes
        return {node: (nodes.get(node, {}).get("items", 0), nodes.get(node, {}).get("batches", 0))
                for node in ("talker", "code_predictor", "frame")}
    before = counts()
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    results = [answer(r) for r in engine.run([spec(engine, greedy) for _ in range(4)])]
    after = counts()
    for node, (items, batches) in after.items():
        items, batches = items - before[node][0], batches - before[node][1]
        assert items >= 4 * FRAMES and items / batches >= 3, (node, items, batches)
    for other in results[1:]:  # batched, still each request's own greedy answer
        assert other[0] == results[0][0] and torch.equal(other[1], results[0][1])
