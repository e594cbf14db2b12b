"""Sampling over a row's candidates only (allowed ranges, top_k): the same choices as over the masked vocabulary."""

from __future__ import annotations

import pytest
import torch

from tests.core.test_sampling_params import over_the_wire
from walkserve.core.sampling import SamplingParams
from walkserve.layers.candidates import (
    CandidateGroup,
    CandidateIds,
    candidate_groups,
    merged_ranges,
)
from walkserve.layers.sampling import Sampler, SampleRow, penalise

transformers = pytest.importorskip("transformers")

V = 300
END = 40  # a stop id below the audio-like ranges, listed after them as Orpheus does
LAYOUTS = [[(100 + 30 * k, 130 + 30 * k), (END, END + 1)] for k in range(5)]  # 31 ids each, like allowed_ranges


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 2


def _masked(logits: torch.Tensor, ranges) -> torch.Tensor:
    keep = torch.zeros(V, dtype=torch.bool)
    for lo, hi in ranges:
        keep[lo:hi] = True
    return logits.masked_fill(~keep, float("-inf"))


def _history(seed: int, layout) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    lo, hi = layout[0]
    prompt = torch.randint(0, V, (12,), generator=g).tolist()
    output = torch.randint(lo, hi, (9,), generator=g).tolist() + [END, lo, lo]  # repeats and the stop id
    return prompt, output


def test_merged_ranges_sort_clip_and_merge():
    assert merged_ranges([(50, 60), (10, 20), (15, 30), (30, 31), (-5, 2), (290, 400), (7, 7)], V) == (
        (0, 2), (10, 31), (50, 60), (290, 300)
    )
    assert merged_ranges([(400, 500)], V) == ()


def test_columns_map_history_ids_to_each_rows_candidates():
    logits = _logits(3)
    allowed = [merged_ranges(LAYOUTS[0], V), merged_ranges(LAYOUTS[2], V), None]
    found = candidate_groups(logits, allowed, [0, 0, 0], CandidateIds())
    compact = next(g for g in found if g.ids is not None)
    assert compact.rows == [0, 1] and compact.x.shape == (2, 31)
    torch.testing.assert_close(compact.x, torch.stack([logits[0, compact.ids[0]], logits[1, compact.ids[1]]]))
    assert compact.ids[0].tolist() == [END, *range(100, 130)]  # ascending: the stop id first
    rows, cols = compact.columns([0, 1], [[END, 101, 5, 101, 170, 999], [171, 101, END]])
    assert list(zip(rows.tolist(), cols.tolist())) == [(0, 0), (0, 2), (0, 2), (1, 12), (1, 0)]
    assert compact.vocab_ids(rows, cols).tolist() == [END, 101, 101, 171, END]


def test_rows_that_cannot_be_compacted_join_the_full_group():
    logits = _logits(4)
    allowed = [merged_ranges([(10, 12)], V), (), merged_ranges([(10, 12)], V), None]
    found = candidate_groups(logits, allowed, [0, 0, 3, 0], CandidateIds())  # row 2 wants 3 top logprobs of 2 ids
    assert [(g.rows, g.ids is None) for g in found] == [([0], False), ([1, 2, 3], True)]
    full = found[1].x
    assert torch.isneginf(full[0]).all() and torch.isneginf(full[1, :10]).all() and torch.isfinite(full[1, 10:12]).all()
    torch.testing.assert_close(full[2], logits[3])


@pytest.mark.parametrize("penalty", [1.0, 1.3, 0.7])
def test_constrained_greedy_equals_argmax_of_penalised_masked_logits(penalty):
    """transformers' repetition penalty over the whole vocabulary, then the mask: the same id, exactly."""
    logits = _logits(len(LAYOUTS), seed=1)
    logits[0, [105, 120]] = logits[0].max() + 3.0  # a tie: the lowest id wins, as over the vocabulary
    rows, want = [], []
    for i, layout in enumerate(LAYOUTS):
        prompt, output = _history(i, layout)
        params = SamplingParams(temperature=0.0, repetition_penalty=penalty, presence_penalty=0.4,
                                frequency_penalty=0.3, min_tokens=len(output) + 1 if i == 1 else 0,
                                stop_token_ids=(END,))
        rows.append(SampleRow(params, prompt + output, output, allowed=layout))
        scores = transformers.RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + output]), logits[i : i + 1].clone())[0]
        counts = torch.bincount(torch.tensor(output), minlength=V).float()
        scores = scores - (0.4 * (counts > 0) + 0.3 * counts)
        if i == 1:
            scores[END] = float("-inf")
        want.append(int(_masked(scores, layout).argmax()))
    got = Sampler(seed=0)(logits, rows).token_ids.tolist()
    assert got == want
    assert not {105, 120} & set(rows[0].prompt_and_output) and got[0] == 105  # the tie survived: lowest id


def test_constrained_logprobs_are_of_the_masked_distribution():
    logits = _logits(3, seed=2)
    rows = [SampleRow(SamplingParams(temperature=0.0, logprobs=5), [], [], allowed=LAYOUTS[k]) for k in (0, 3)]
    rows.append(SampleRow(SamplingParams(temperature=0.7, seed=9, logprobs=2), [], [], allowed=LAYOUTS[1]))
    out = Sampler(seed=0)(logits, rows)
    for i, k in enumerate((0, 3, 1)):
        ref = torch.log_softmax(_masked(logits[i], LAYOUTS[k]), -1)
        torch.testing.assert_close(out.logprobs[i], ref[out.token_ids[i]])
        n = rows[i].params.logprobs
        torch.testing.assert_close(out.top_logprobs[i, :n], ref.topk(n).values)
        assert out.top_ids[i, :n].tolist() == ref.topk(n).indices.tolist()


def test_more_top_logprobs_than_candidates_reports_them_all():
    logits = torch.zeros(1, 8)
    logits[0, 3] = 1.0
    out = Sampler(seed=0)(logits, [SampleRow(SamplingParams(temperature=0.0, logprobs=3), [], [], allowed=[(2, 4)])])
    assert out.token_ids.tolist() == [3] and out.top_ids[0, :2].tolist() == [3, 2]
    assert torch.isneginf(out.top_logprobs[0, 2])  # a third id was never possible


def test_constrained_draws_follow_the_masked_softmax_with_top_p():
    logits = torch.full((1, V), -1.0)
    logits[0, 100:130] = torch.linspace(2.0, -4.0, 30)[torch.randperm(30, generator=torch.Generator().manual_seed(0))]
    logits[0, END] = 0.55  # distinct values: no tie straddles the top-p boundary
    logits[0, 7] = 9.0  # never allowed
    n = 6000
    params = SamplingParams(temperature=0.8, top_p=0.9)
    rows = [SampleRow(params, [], [], allowed=LAYOUTS[0])] * n
    tokens = Sampler(seed=3)(logits.expand(n, V), rows).token_ids
    scaled = _masked(logits[0], LAYOUTS[0]) / 0.8
    kept = transformers.TopPLogitsWarper(0.9)(None, scaled[None].clone())[0]
    want = torch.softmax(kept, -1)
    assert set(tokens.tolist()) == set(torch.nonzero(want).flatten().tolist())
    freq = torch.bincount(tokens, minlength=V).float() / n
    torch.testing.assert_close(freq, want, atol=0.025, rtol=0)  # ~4 sigma


def test_top_k_draws_follow_the_top_k_softmax():
    logits = _logits(1, seed=4)
    n = 6000
    rows = [SampleRow(SamplingParams(temperature=1.3, top_k=5), [], [])] * n
    tokens = Sampler(seed=5)(logits.expand(n, V), rows).token_ids
    kept = transformers.TopKLogitsWarper(5)(None, logits / 1.3)[0]
    want = torch.softmax(kept, -1)
    assert set(tokens.tolist()) == set(torch.nonzero(want).flatten().tolist())
    torch.testing.assert_close(torch.bincount(tokens, minlength=V).float() / n, want, atol=0.03, rtol=0)


@pytest.mark.parametrize("mine", [
    SamplingParams(temperature=0.6, top_p=0.8, repetition_penalty=1.3, seed=1234),
    SamplingParams(temperature=1.1, top_k=7, top_p=0.95, seed=77),
])
@pytest.mark.parametrize("allowed", [LAYOUTS[2], None])
def test_seeded_candidate_draws_do_not_depend_on_the_batch(mine, allowed):
    """Alone, then among rows of other layouts, unconstrained rows, other top_k and a full-group fallback."""
    logits = _logits(6, seed=6)
    prompt, output = _history(3, LAYOUTS[2])
    row = SampleRow(mine, prompt + output, output, allowed=allowed)
    alone = [int(Sampler(seed=s)(logits[4:5], [row]).token_ids[0]) for s in (0, 1)]
    others = [
        SampleRow(SamplingParams(temperature=0.9, seed=5), [], [3], allowed=LAYOUTS[0]),
        SampleRow(SamplingParams(temperature=1.0, top_k=20, seed=8), [], []),  # narrowed wider than mine
        SampleRow(SamplingParams(temperature=0.0, logprobs=4), [], [], allowed=[(5, 7)]),
        SampleRow(SamplingParams(temperature=0.7, top_k=40, seed=3), [], [], allowed=LAYOUTS[4]),
        row,
        SampleRow(SamplingParams(temperature=0.5), [], [], allowed=LAYOUTS[1]),
    ]
    batched = int(Sampler(seed=9)(logits, others).token_ids[4])
    assert alone[0] == alone[1] == batched
    if allowed is not None:
        assert any(lo <= batched < hi for lo, hi in allowed)


def test_seeded_candidate_draws_change_with_the_step():
    logits = torch.zeros(1, V)
    draws = [
        int(Sampler()(logits, [SampleRow(SamplingParams(seed=42), [], [0] * step, allowed=LAYOUTS[0])]).token_ids)
        for step in range(10)
    ]
    assert len(set(draws)) > 5 and set(draws) <= {END, *range(100, 130)}


def test_apply_penalties_leaves_ids_outside_the_history_alone():
    group = CandidateGroup([0], torch.tensor([[2.0, -2.0, 3.0, 0.0]]), None, 4)
    row = SampleRow(SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5), [0, 1, 1, 9], [1, 1])
    penalise(group, [row])
    assert group.x.tolist() == [[1.0, -5.0, 3.0, 0.0]]


def test_logit_bias_over_the_vocabulary_and_over_candidates():
    """Greedy choice and logprobs are those of logits + bias (masked to the allowed ids for constrained rows)."""
    logits = _logits(4, seed=5)
    allowed = LAYOUTS[2]
    inside, outside = allowed[0][0] + 3, 7  # an allowed id, and one the constrained row can never pick
    rows = [
        SampleRow(SamplingParams(temperature=0.0, logprobs=3, logit_bias=((11, 100.0),)), [], []),
        SampleRow(SamplingParams(temperature=0.0, logprobs=3, logit_bias=((int(logits[1].argmax()), -100.0),)), [], []),
        SampleRow(SamplingParams(temperature=0.0, logprobs=3, logit_bias=((inside, 25.0), (outside, 100.0))), [], [],
                  allowed=allowed),
        SampleRow(SamplingParams(temperature=0.0, logprobs=3), [], []),  # no bias: untouched by its neighbours'
    ]
    out = Sampler(seed=0)(logits, rows)
    for i, row in enumerate(rows):
        ref = logits[i].clone()
        for token, bias in row.params.logit_bias:
            ref[token] += bias
        if row.allowed is not None:
            ref = _masked(ref, row.allowed)
        ref = torch.log_softmax(ref, -1)
        assert out.token_ids[i].item() == ref.argmax().item()
        torch.testing.assert_close(out.logprobs[i], ref[out.token_ids[i]])
        torch.testing.assert_close(out.top_logprobs[i], ref.topk(3).values)
    assert out.token_ids[0].item() == 11 and out.token_ids[2].item() == inside
    assert out.token_ids[1].item() != logits[1].argmax().item()


def test_logit_bias_is_checked_and_travels():
    params = SamplingParams(logit_bias=((5, -1.5), (9, 100.0)))
    assert over_the_wire(params) == (params, params)
    for bad in (((5, 101.0),), ((-1, 1.0),), ((5, float("nan")),), ((5, 1.0), (5, 2.0)), tuple((i, 1.0) for i in range(301))):
        with pytest.raises(Exception, match="logit_bias"):
            SamplingParams(logit_bias=bad)
