"""The speech path's rules as data: voices, sampling ranges and defaults, the trailing-text queue, turn selection."""

from __future__ import annotations

import pytest
import torch

from walkserve.core.errors import InvalidRequest
from walkserve.core.sampling import SamplingParams
from walkserve.layers.sampling import Sampler, SampleRow
from walkserve.models.qwen3_omni.speech.rules import (
    PREDICTOR_SAMPLING,
    TALKER_SAMPLING,
    assistant_start,
    code0_ranges,
    node_sampling,
    predictor_ranges,
    speaker_id,
    spoken_tokens,
    trailing_text,
    user_positions,
    voices,
)

RELEASE_SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}


def test_voices_are_case_insensitive_with_ethan_by_default():
    assert speaker_id(RELEASE_SPEAKERS, None) == 2302
    assert speaker_id(RELEASE_SPEAKERS, "Chelsie") == speaker_id(RELEASE_SPEAKERS, "CHELSIE") == 2301
    assert speaker_id(RELEASE_SPEAKERS, "aiden") == 2303
    assert voices(RELEASE_SPEAKERS) == ["Ethan", "Chelsie", "Aiden"]
    with pytest.raises(InvalidRequest, match="Chelsie, Ethan, Aiden") as e:
        speaker_id(RELEASE_SPEAKERS, "tara")
    assert e.value.param == "audio.voice"


def test_code0_may_be_a_code_or_codec_eos_only():
    assert code0_ranges(3072, 2150) == [(0, 2048), (2150, 2151)]  # the release: 2048-3071 suppressed but EOS
    logits = torch.zeros(1, 3072)
    logits[0, 2200] = logits[0, 3000] = 50.0  # control ids the model likes best are never drawn
    logits[0, 2150] = 10.0
    row = SampleRow(SamplingParams(temperature=0.0), [], [], allowed=code0_ranges(3072, 2150))
    assert int(Sampler(seed=0)(logits, [row]).token_ids[0]) == 2150
    sampled = SampleRow(TALKER_SAMPLING, [], [], allowed=code0_ranges(3072, 2150))
    draws = Sampler(seed=1)(logits.expand(64, -1), [sampled] * 64).token_ids
    assert set(draws.tolist()) <= set(range(2048)) | {2150}


def test_predictor_step_g_draws_from_block_g():
    assert predictor_ranges(0, 2048) == [(0, 2048)] and predictor_ranges(14, 2048) == [(28672, 30720)]
    logits = torch.randn(1, 15 * 8, generator=torch.Generator().manual_seed(0))
    for step in range(15):
        row = SampleRow(PREDICTOR_SAMPLING, [], [], allowed=predictor_ranges(step, 8))
        assert int(Sampler(seed=step)(logits, [row]).token_ids[0]) // 8 == step


def test_sampling_defaults_and_per_node_overrides():
    assert (TALKER_SAMPLING.temperature, TALKER_SAMPLING.top_k, TALKER_SAMPLING.top_p,
            TALKER_SAMPLING.repetition_penalty) == (0.9, 50, 1.0, 1.05)
    assert (PREDICTOR_SAMPLING.temperature, PREDICTOR_SAMPLING.top_k, PREDICTOR_SAMPLING.top_p) == (1.0, 50, 0.8)
    greedy = node_sampling(SamplingParams(temperature=0.0), TALKER_SAMPLING)
    assert greedy.greedy and greedy.repetition_penalty == 1.0  # temperature 0: greedy, no penalty
    assert node_sampling(SamplingParams(), TALKER_SAMPLING) == TALKER_SAMPLING
    mixed = node_sampling(SamplingParams(temperature=0.0), TALKER_SAMPLING, {"temperature": 0.7, "top_k": 20})
    assert (mixed.temperature, mixed.top_k) == (0.7, 20)
    with pytest.raises(InvalidRequest):
        node_sampling(SamplingParams(), TALKER_SAMPLING, {"temperature": -1})
    with pytest.raises(InvalidRequest, match="per-node sampling"):
        node_sampling(SamplingParams(), TALKER_SAMPLING, {"temprature": 0.7})


def test_trailing_text_queue():
    # 4 tokens spoken: token 0 is in the prefix; steps 0..2 read tokens 1..3, then tts_eos once, then tts_pad
    kinds = [trailing_text(i, 4, True) for i in range(6)]
    assert [(k.kind, k.token) for k in kinds] == [("token", 1), ("token", 2), ("token", 3), ("eos", -1),
                                                 ("pad", -1), ("pad", -1)]
    assert trailing_text(2, 3, False).kind == "wait"  # token 3 has not arrived and the thinker still runs
    assert trailing_text(1, 3, False) == trailing_text(1, 3, True)  # a known token never waits
    assert trailing_text(0, 1, True).kind == "eos"  # a one-token answer


def test_spoken_tokens():
    assert spoken_tokens([5, 6, 7, 99], (99,)) == [5, 6, 7]  # EOS is not spoken
    assert spoken_tokens([5, 6, 7], (99,)) == [5, 6, 7]  # stopped by max_tokens: we speak every token
    assert spoken_tokens([5, 6, 7], (99,), drop_unfinished_last=True) == [5, 6]  # transformers drops the last


def test_user_turns_and_assistant_start():
    S, E, SYS, U, A = 1, 2, 3, 4, 5  # im_start, im_end, system, user, assistant
    ids = [S, SYS, 9, E, S, U, 7, 8, E, S, A, 6, E, S, U, 7, E, S, A, 10]
    assert user_positions(ids, S, U) == [4, 5, 6, 7, 8, 13, 14, 15, 16]  # both user turns, nothing else
    assert assistant_start(ids, S, A) == 17
    with pytest.raises(InvalidRequest, match="no <|im_start|>assistant"):
        assistant_start(ids[:9], S, A)
