"""Constrained decoding: SampleRow.allowed in the sampler and node_params["token_ranges"] in the KV engine."""

from __future__ import annotations

import itertools

import pytest
import torch

from walkserve.core.sampling import SamplingParams
from walkserve.engines.base import Firing
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.layers.sampling import Sampler, SampleRow
from walkserve.models.llama.tiny import write_tiny
from walkserve.models.llama.weights import load_causal_lm

torch.set_num_threads(1)
_ids = itertools.count()


def test_sampler_draws_only_allowed_ids():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    logits[:, 7] = 100.0  # the favourite, never allowed
    rows = [
        SampleRow(SamplingParams(temperature=0.0), [], [], allowed=[(10, 20)]),
        SampleRow(SamplingParams(temperature=1.5, seed=3), [], [], allowed=[(30, 32), (45, 46)]),
        SampleRow(SamplingParams(temperature=1.0, top_p=0.5), [], [], allowed=[(0, 5), (60, 99)]),
        SampleRow(SamplingParams(temperature=0.0), [], []),  # unconstrained
    ]
    sampler = Sampler(seed=1)
    for _ in range(20):
        out = sampler(logits, rows).token_ids.tolist()
        assert 10 <= out[0] < 20 and out[0] == int(logits[0, 10:20].argmax()) + 10
        assert out[1] in (30, 31, 45) and 0 <= out[2] < 5 and out[3] == 7


def test_logprobs_are_of_the_constrained_distribution():
    logits = torch.zeros(1, 8)
    row = SampleRow(SamplingParams(temperature=0.0, logprobs=2), [], [], allowed=[(2, 4)])
    out = Sampler(seed=0)(logits, [row])
    assert out.logprobs.item() == pytest.approx(torch.log(torch.tensor(0.5)).item())


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return write_tiny("llama", tmp_path_factory.mktemp("ranges_lm"), seed=5)


@pytest.fixture(scope="module")
def engine(lm_path) -> KVCacheEngine:
    return KVCacheEngine("lm", load_causal_lm(lm_path, progress=False), "cpu", "float32", num_blocks=32)


def _firing(request_id: str, tokens: list[int], ranges, sampling: SamplingParams) -> Firing:
    return Firing(id=next(_ids), request_id=request_id, walk="decode", node="lm", component="lm", op="forward",
                  path=(), inputs={"tokens": torch.tensor(tokens)}, outputs=("token",), sampling=sampling,
                  node_params={"token_ranges": ranges})


def _generate(engine: KVCacheEngine, request_id: str, ranges, sampling: SamplingParams, n: int) -> list[int]:
    """Drive a decode loop: prompt, then feed every sampled token back."""
    out, tokens = [], [3, 14, 15, 92]
    for _ in range(n):
        engine.submit(_firing(request_id, tokens, ranges, sampling))
        results = []
        while not results:
            results = engine.step()
        assert results[0].error is None, results[0].error
        tokens = [int(results[0].outputs["token"][0])]
        out.append(tokens[0])
    engine.release(request_id)
    return out


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=4)])
def test_engine_applies_a_position_dependent_rule(engine, sampling):
    def ranges(n: int) -> list[tuple[int, int]]:
        lo = 100 + (n % 3) * 100  # position 0: [100, 200), 1: [200, 300), 2: [300, 400)
        return [(lo, lo + 100)]

    tokens = _generate(engine, f"req-{sampling.temperature}", ranges, sampling, 9)
    assert [t // 100 for t in tokens] == [1, 2, 3] * 3


def test_engine_accepts_a_fixed_list(engine):
    tokens = _generate(engine, "req-fixed", [(40, 41), (50, 51)], SamplingParams(temperature=0.0), 5)
    assert set(tokens) <= {40, 50}


def test_every_allowed_id_is_emittable():
    from walkserve.models.orpheus.tokens import EMITTABLE_RANGES, allowed_ranges

    def covered(lo: int, hi: int) -> bool:
        return any(a <= lo and hi <= b for a, b in EMITTABLE_RANGES)

    for n in range(14):
        assert all(covered(lo, hi) for lo, hi in allowed_ranges(n)), n


def test_restricted_head_keeps_the_logits_of_its_ranges(tmp_path):
    model = load_causal_lm(write_tiny("llama", tmp_path, seed=6), progress=False)
    hidden = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    full = model.compute_logits(hidden)  # [3, V]
    ranges = [(5, 9), (100, 140)]
    model.restrict_vocab(ranges)
    part = model.compute_logits(hidden)
    keep = torch.zeros(full.shape[1], dtype=torch.bool)
    keep[5:9] = keep[100:140] = True
    torch.testing.assert_close(part[:, keep], full[:, keep], rtol=0, atol=1e-6)
    assert torch.isneginf(part[:, ~keep]).all() and part.dtype == torch.float32
    with pytest.raises(ValueError, match=r"\[0, 2000000\) is not inside"):
        model.restrict_vocab([(0, 2_000_000)])


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9, seed=2)])
def test_restricted_head_samples_what_the_full_head_samples(engine, lm_path, sampling):
    """Masked ids never win, so computing only the rows the ranges can allow changes no draw."""
    model = load_causal_lm(lm_path, progress=False)
    model.restrict_vocab([(100, 400)])
    restricted = KVCacheEngine("lm", model, "cpu", "float32", num_blocks=32)

    def ranges(n: int) -> list[tuple[int, int]]:
        lo = 100 + (n % 3) * 100
        return [(lo, lo + 100)]

    want = _generate(engine, "req-full", ranges, sampling, 12)
    assert _generate(restricted, "req-restricted", ranges, sampling, 12) == want
