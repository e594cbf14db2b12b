"""Sampler semantics, option by option (transformers' logits processors are the oracle where one exists)."""

from __future__ import annotations

import math

import pytest
import torch

from walkserve.core.sampling import SamplingParams
from walkserve.layers.sampling import Sampler, SampleRow, apply_penalties, filtered_probs, step_seed

transformers = pytest.importorskip("transformers")


def _row(prompt=(), output=(), **params) -> SampleRow:
    return SampleRow(SamplingParams(**params), list(prompt) + list(output), list(output))


def _logits(rows: int = 3, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_greedy_is_argmax_and_ignores_seed_and_filters():
    logits = _logits()
    rows = [_row(temperature=0.0), _row(temperature=0.0, seed=3, top_k=2, top_p=0.5), _row(temperature=0.0)]
    out = Sampler(seed=0)(logits, rows)
    assert out.token_ids.tolist() == logits.argmax(-1).tolist()
    assert out.logprobs is None


def test_temperature_draws_follow_softmax():
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.5]]).repeat(5000, 1)
    rows = [_row(temperature=0.7)] * len(logits)
    tokens = Sampler(seed=1)(logits, rows).token_ids
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    torch.testing.assert_close(freq, torch.softmax(logits[0] / 0.7, -1), atol=0.03, rtol=0)  # ~4 sigma


def _hf_kept(warper, logits: torch.Tensor) -> list[set[int]]:
    scores = warper(torch.zeros(len(logits), 1, dtype=torch.long), logits.clone())
    return [set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in scores]


def _kept(logits: torch.Tensor, **params) -> list[set[int]]:
    probs = filtered_probs(logits, [SamplingParams(**params)] * len(logits))
    return [set(torch.nonzero(row > 0).flatten().tolist()) for row in probs]


@pytest.mark.parametrize("k", [1, 3, 17])
def test_top_k_matches_transformers(k):
    logits = _logits(4)
    assert _kept(logits, top_k=k) == _hf_kept(transformers.TopKLogitsWarper(k), logits)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.8, 0.95])
def test_top_p_matches_transformers(p):
    logits = _logits(4)
    assert _kept(logits, top_p=p) == _hf_kept(transformers.TopPLogitsWarper(p), logits)


def test_top_p_keeps_the_smallest_head_reaching_p():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert _kept(logits, top_p=0.8) == [{0, 1}]
    assert _kept(logits, top_p=0.81) == [{0, 1, 2}]
    assert _kept(logits, top_p=0.01) == [{0}]


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.6])
def test_min_p_matches_transformers(min_p):
    logits = _logits(4)
    assert _kept(logits, min_p=min_p) == _hf_kept(transformers.MinPLogitsWarper(min_p), logits)


def test_top_k_then_top_p_and_temperature_compose_per_row():
    logits = _logits(3)
    params = [SamplingParams(top_k=5, top_p=0.6), SamplingParams(temperature=2.0), SamplingParams(top_k=1)]
    probs = filtered_probs(logits, params)
    hf_first = transformers.TopPLogitsWarper(0.6)(None, transformers.TopKLogitsWarper(5)(None, logits[:1].clone()))
    assert set(torch.nonzero(probs[0]).flatten().tolist()) == set(
        torch.nonzero(hf_first[0] > float("-inf")).flatten().tolist()
    )
    torch.testing.assert_close(probs[1], torch.softmax(logits[1] / 2.0, -1))
    assert torch.nonzero(probs[2]).flatten().tolist() == [int(logits[2].argmax())]


def test_repetition_penalty_matches_transformers():
    logits = _logits(2)
    prompt, output = [3, 7, 7, 10], [12, 3]
    rows = [_row(prompt, output, repetition_penalty=1.7), _row(repetition_penalty=1.0)]
    got = logits.clone()
    apply_penalties(got, rows)
    ids = torch.tensor([prompt + output])
    want = transformers.RepetitionPenaltyLogitsProcessor(1.7)(ids, logits[:1].clone())
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], logits[1])


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = torch.zeros(1, 6)
    apply_penalties(logits, [_row(prompt=[4, 4, 5], output=[1, 1, 2], presence_penalty=0.5, frequency_penalty=0.25)])
    assert logits[0].tolist() == [0.0, -1.0, -0.75, 0.0, 0.0, 0.0]


def test_min_tokens_masks_stop_ids_until_reached():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.0]])
    params = {"temperature": 0.0, "min_tokens": 2, "stop_token_ids": (1, 3)}
    assert Sampler()(logits, [_row(output=[2], **params)]).token_ids.tolist() == [2]
    assert Sampler()(logits, [_row(output=[2, 2], **params)]).token_ids.tolist() == [1]


def test_logprobs_of_the_drawn_token_and_the_top_k():
    logits = _logits(2)
    rows = [_row(temperature=0.0, logprobs=3), _row(temperature=1.0, seed=5, logprobs=1)]
    out = Sampler()(logits, rows)
    ref = torch.log_softmax(logits, -1)
    torch.testing.assert_close(out.logprobs, ref.gather(1, out.token_ids[:, None]).squeeze(1))
    assert out.top_ids.shape == (2, 3)
    assert out.top_ids[0].tolist() == ref[0].topk(3).indices.tolist()
    torch.testing.assert_close(out.top_logprobs[0], ref[0].topk(3).values)
    assert math.isclose(float(out.top_logprobs[0, 0]), float(out.logprobs[0]), rel_tol=1e-6)


def test_seeded_draws_do_not_depend_on_the_batch():
    logits = _logits(4, vocab=1000, seed=1)
    mine = _row(output=[5] * 3, temperature=1.2, top_p=0.95, seed=1234)
    alone = Sampler(seed=0)(logits[2:3], [mine]).token_ids
    others = [_row(temperature=1.0), _row(temperature=0.0), mine, _row(temperature=0.8, seed=99)]
    batched = Sampler(seed=77)(logits, others).token_ids
    assert batched[2] == alone[0]


def test_seeded_draws_change_with_the_step_and_repeat_with_the_seed():
    logits = torch.zeros(1, 1000)  # uniform: every draw is the noise alone
    draws = [int(Sampler()(logits, [_row(output=[0] * step, seed=42)]).token_ids) for step in range(8)]
    again = [int(Sampler()(logits, [_row(output=[0] * step, seed=42)]).token_ids) for step in range(8)]
    other = [int(Sampler()(logits, [_row(output=[0] * step, seed=43)]).token_ids) for step in range(8)]
    assert draws == again
    assert len(set(draws)) > 4 and draws != other
    assert len({step_seed(42, s) for s in range(1000)}) == 1000


def test_unseeded_rows_use_the_sampler_generator():
    logits = torch.zeros(64, 1000)
    rows = [_row() for _ in range(64)]
    first, second = Sampler(seed=5)(logits, rows).token_ids, Sampler(seed=5)(logits, rows).token_ids
    assert first.tolist() == second.tolist()
    sampler = Sampler(seed=5)
    sampler(logits, rows)
    assert sampler(logits, rows).token_ids.tolist() != first.tolist()  # the process RNG advances


def test_greedy_fast_path_equals_the_full_pipeline():
    logits = _logits(4, vocab=40, seed=3)
    logits[1, [7, 20]] = logits[1].max() + 1.0  # a tie: the first index wins on both paths
    plain = [_row(temperature=0.0) for _ in range(4)]
    fast = Sampler(seed=0)(logits, plain).token_ids
    assert fast.tolist() == logits.argmax(-1).tolist() and fast[1].item() == 7
    # one row that needs the full pipeline (logprobs) sends the whole batch through it: same tokens
    full = Sampler(seed=0)(logits, [*plain[:3], _row(temperature=0.0, logprobs=1)])
    assert full.token_ids.tolist() == fast.tolist() and full.logprobs is not None
    # a greedy row still short of min_tokens is not plain: its stop ids stay masked
    stop = int(fast[0])
    rows = [_row(temperature=0.0, min_tokens=1, stop_token_ids=(stop,)), *plain[1:]]
    assert Sampler(seed=0)(logits, rows).token_ids[0].item() != stop
