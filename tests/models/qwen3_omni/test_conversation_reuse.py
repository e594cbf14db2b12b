"""A conversation's follow-up turn over HTTP reuses the earlier turns' KV (prefix cache keyed on content).

Two servers on the speech checkpoint (one rank, block size 4): one with the prefix cache, one without.
Each greedy answer of the cached server (text out, and text + audio out) equals the uncached server's;
/metrics shows that a follow-up turn prefills only the new turn (and the rest of the block where it
starts), spoken answers included, and that a turn whose earlier clip or image differs reuses nothing of it.
"""

from __future__ import annotations

import base64
import io
import time

import openai
import pytest
import soundfile as sf
import torch

from tests.api.real_server import in_thread_server, metric, metrics
from tests.models.qwen3_omni.conftest import rgb, wave
from tests.models.qwen3_omni.test_serving import decoded, png_url, wav_b64
from tests.models.qwen3_omni.test_speech_serving import (
    assert_wave_equal,
    served_dir,  # noqa: F401  (the speech checkpoint)
)
from walkserve.core.config import RuntimeConfig
from walkserve.models.qwen3_omni.processor import OmniParams, Qwen3OmniProcessor
from walkserve.placements import path as placement_path

pytestmark = [pytest.mark.slow, pytest.mark.parity]
BS, MAX_TOKENS = 4, 6
CLIP_A, CLIP_B, CLIP_C = wave(1.37, seed=1), wave(0.9, seed=2), wave(1.37, seed=3)  # B shorter: A's features hold


def _server(dirname, caching: bool):
    kv = {"block_size": BS, "prefix_caching": caching}
    config = RuntimeConfig(max_running=8, status_interval_s=0.05, engine_options={"kv": kv})
    return in_thread_server("qwen3-omni", dirname, config,
                            placement=str(placement_path("qwen3-omni")))


@pytest.fixture(scope="module")
def cached(served_dir):  # noqa: F811
    with _server(served_dir, True) as s:
        yield s


@pytest.fixture(scope="module")
def fresh(served_dir):  # noqa: F811
    with _server(served_dir, False) as s:
        yield s


@pytest.fixture(scope="module")
def processor(served_dir) -> Qwen3OmniProcessor:  # noqa: F811
    return Qwen3OmniProcessor(served_dir)


def _audio(clip) -> dict:
    return {"type": "input_audio", "input_audio": {"data": wav_b64(clip), "format": "wav"}}


def _user(*parts) -> dict:
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}


def _chat(server, messages: list[dict], **kw):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    return client.chat.completions.create(model="tiny-omni-speech", messages=messages, temperature=0.0,
                                          max_tokens=MAX_TOKENS, **kw)


def _counters(server) -> tuple[float, float]:
    """(prefilled, reused) prompt tokens of the thinker's pool so far, as the workers last reported them."""
    samples = metrics(server.url)
    labels = {"component": "thinker", "rank": "0"}
    return (metric(samples, "walkserve_kv_pool_prefill_tokens_total", **labels),
            metric(samples, "walkserve_kv_pool_prefix_hit_tokens_total", **labels))


def _measured(server, messages: list[dict], last_apart: bool = False, **kw):
    """The answer, and the prompt tokens it prefilled and reused (once the workers reported all its prompt rows:
    every one but the last when ``last_apart``, a spoken answer's, whose last row is a one-row firing)."""
    before = _counters(server)
    answer = _chat(server, messages, **kw)
    rows = answer.usage.prompt_tokens - (1 if last_apart else 0)
    deadline = time.monotonic() + 20
    while True:
        after = _counters(server)
        if after[0] + after[1] - before[0] - before[1] >= rows or time.monotonic() > deadline:
            return answer, after[0] - before[0], after[1] - before[1]
        time.sleep(0.05)


def _wave(answer) -> torch.Tensor:
    samples, _ = sf.read(io.BytesIO(base64.b64decode(answer.choices[0].message.audio.data)), dtype="float32")
    return torch.from_numpy(samples)


def _ids(processor, messages) -> list[int]:
    request, _ = processor.thinker_request("chat", {"messages": decoded(messages)}, OmniParams())
    return request.input_ids


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_a_follow_up_turn_prefills_only_the_new_turn_and_answers_the_same(cached, fresh, processor):
    turn1 = [{"role": "system", "content": "Be brief"}, _user(_audio(CLIP_A), "What was said?")]
    first, prefilled1, _ = _measured(cached, turn1)
    assert first.choices[0].message.content == _chat(fresh, turn1).choices[0].message.content
    assert prefilled1 == first.usage.prompt_tokens  # nothing cached yet: the whole prompt ran
    turn2 = [*turn1, {"role": "assistant", "content": first.choices[0].message.content},
             _user(_audio(CLIP_B), "And this one?")]
    second, prefilled2, reused2 = _measured(cached, turn2)
    assert second.choices[0].message.content == _chat(fresh, turn2).choices[0].message.content
    n1, n2 = len(_ids(processor, turn1)), second.usage.prompt_tokens
    assert n2 == len(_ids(processor, turn2)) and prefilled2 + reused2 == n2
    # every full block of turn 1's prompt, the one its first piece (the first clip) ends in too
    assert reused2 >= n1 // BS * BS
    assert prefilled2 < n2 - n1 + BS
    # the same follow-up again: only the block holding its last row is computed
    again, prefilled3, reused3 = _measured(cached, turn2)
    assert again.choices[0].message.content == second.choices[0].message.content
    assert prefilled3 <= BS and prefilled3 + reused3 == n2


def test_other_audio_with_the_same_text_reuses_nothing_of_the_clip(cached, fresh, processor):
    turn = [{"role": "system", "content": "Be brief"}, _user(_audio(CLIP_A), "Who speaks?")]
    _measured(cached, turn)
    other = [turn[0], _user(_audio(CLIP_C), "Who speaks?")]  # same length, same tokens, another clip
    assert _ids(processor, other) == _ids(processor, turn)
    answer, prefilled, reused = _measured(cached, other)
    assert answer.choices[0].message.content == _chat(fresh, other).choices[0].message.content
    clip_start = _ids(processor, turn).index(processor.config.tokens.audio_token_id)
    assert reused <= clip_start and prefilled >= answer.usage.prompt_tokens - clip_start


def test_another_image_reuses_nothing_of_it(cached, fresh, processor):
    turn = [_user({"type": "image_url", "image_url": {"url": png_url(rgb(56, 56, seed=5))}}, "Describe it")]
    _measured(cached, turn)
    other = [_user({"type": "image_url", "image_url": {"url": png_url(rgb(56, 56, seed=6))}}, "Describe it")]
    assert _ids(processor, other) == _ids(processor, turn)
    answer, prefilled, reused = _measured(cached, other)
    assert answer.choices[0].message.content == _chat(fresh, other).choices[0].message.content
    image_start = _ids(processor, turn).index(processor.config.tokens.image_token_id)
    assert reused <= image_start and prefilled >= answer.usage.prompt_tokens - image_start
    _, _, same = _measured(cached, turn)  # the first image again: its blocks are reused
    assert same == (len(_ids(processor, turn)) - 1) // BS * BS


def test_a_spoken_follow_up_prefills_only_the_new_turn_and_answers_the_same(cached, fresh, processor):
    """Text + audio out: the thinker's media pieces hand their rows' layer-24 inputs to the talker; the capture cache
    gives an earlier turn's clip those rows without running it again, so a follow-up turn's thinker prefill is the
    new turn (and the rest of the block where it starts), as for a text answer. Transcript and audio equal the
    uncached server's."""
    speech = dict(modalities=["text", "audio"], audio={"voice": "Chelsie", "format": "wav", "max_frames": 8})
    turn1 = [{"role": "system", "content": "Be brief"}, _user("Say hello", _audio(CLIP_B), "please")]
    first, _, _ = _measured(cached, turn1, last_apart=True, **speech)
    want = _chat(fresh, turn1, **speech)
    assert first.choices[0].message.audio.transcript == want.choices[0].message.audio.transcript
    assert_wave_equal(_wave(first), _wave(want), quantum=1 / 32768)
    again, prefilled, reused = _measured(cached, turn1, last_apart=True, **speech)
    assert again.choices[0].message.audio.transcript == want.choices[0].message.audio.transcript
    assert_wave_equal(_wave(again), _wave(want), quantum=1 / 32768)
    assert prefilled + reused == again.usage.prompt_tokens - 1  # the last token: thinker_first
    assert prefilled < BS  # the clip too: only the block holding the prompt's end runs
    turn2 = [*turn1, {"role": "assistant", "content": first.choices[0].message.audio.transcript},
             _user(_audio(CLIP_B), "And again?")]
    second, prefilled2, reused2 = _measured(cached, turn2, last_apart=True, **speech)
    want2 = _chat(fresh, turn2, **speech)
    assert second.choices[0].message.audio.transcript == want2.choices[0].message.audio.transcript
    assert_wave_equal(_wave(second), _wave(want2), quantum=1 / 32768)
    n1, n2 = len(_ids(processor, turn1)), second.usage.prompt_tokens
    assert prefilled2 + reused2 == n2 - 1
    assert reused2 >= (n1 - 1) // BS * BS and prefilled2 < n2 - n1 + BS  # turn 1's clip is not run again
    hits = metric(metrics(cached.url), "walkserve_kv_pool_capture_cache_hits_total", component="thinker", rank="0")
    assert hits >= 2  # turn 1's clip, answered twice from the capture cache


def test_a_longer_clip_in_the_follow_up_keeps_the_earlier_clip_cached(cached, fresh, processor):
    """Each clip's features are its own: a follow-up turn whose clip is longer than turn 1's still reuses
    turn 1's clip (padded to the longest clip, its features and content keys would change)."""
    turn1 = [_user(_audio(CLIP_B), "Hear this")]
    first, _, _ = _measured(cached, turn1)
    turn2 = [*turn1, {"role": "assistant", "content": first.choices[0].message.content},
             _user(_audio(CLIP_A), "and this, longer")]
    second, prefilled, reused = _measured(cached, turn2)
    assert second.choices[0].message.content == _chat(fresh, turn2).choices[0].message.content
    clip_end = len(_ids(processor, turn1)) - _ids(processor, turn1)[::-1].index(processor.config.tokens.audio_token_id)
    assert reused >= clip_end // BS * BS  # every full block through turn 1's clip
    assert prefilled + reused == second.usage.prompt_tokens
