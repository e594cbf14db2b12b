"""Constrained decoding: SampleRow.allowed in the sampler and node_params["token_ranges"] in the KV engine."""

from __future__ import annotations

import itertools

import pytest
import torch

from walkserve.core.options import KVOptions
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
    return KVCacheEngine("lm", load_causal_lm(lm_path, progress=False), "cpu", "float32", KVOptions(num_blocks=32))


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
    restricted = KVCacheEngine("lm", model, "cpu", "float32", KVOptions(num_blocks=32))

    def ranges(n: int) -> list[tuple[int, int]]:
        lo = 100 + (n % 3) * 100
        return [(lo, lo + 100)]

    want = _generate(engine, "req-full", ranges, sampling, 12)
    assert _generate(restricted, "req-restricted", ranges, sampling, 12) == want


def test_per_row_head_computes_each_rows_ranges_only(tmp_path):
    model = load_causal_lm(write_tiny("llama", tmp_path, seed=6), progress=False)
    hidden = torch.randn(4, model.config.hidden_size, generator=torch.Generator().manual_seed(2))
    full = model.compute_logits(hidden)  # [4, V]
    allowed = [[(5, 9), (100, 140)], None, [(100, 140), (5, 9)], [(300, 310), (305, 320)]]
    part = model.compute_logits(hidden, allowed=allowed)
    for row, ranges in enumerate(allowed):
        keep = torch.zeros(full.shape[1], dtype=torch.bool)
        for lo, hi in ranges or [(0, full.shape[1])]:
            keep[lo:hi] = True
        torch.testing.assert_close(part[row, keep], full[row, keep], rtol=0, atol=1e-5)
        assert torch.isneginf(part[row, ~keep]).all(), row
    model.restrict_vocab([(0, 8), (120, 400)])  # a row sees the ids of both its ranges and the model's
    part = model.compute_logits(hidden, allowed=allowed)
    assert torch.isfinite(part[0]).nonzero().flatten().tolist() == [5, 6, 7, *range(120, 140)]
    assert torch.isfinite(part[1]).nonzero().flatten().tolist() == [*range(8), *range(120, 400)]
    assert torch.isfinite(part[3]).nonzero().flatten().tolist() == list(range(300, 320))


def test_intersect_ranges():
    from walkserve.layers.candidates import intersect_ranges

    assert intersect_ranges(((0, 10), (20, 30)), ((5, 25),)) == ((5, 10), (20, 25))
    assert intersect_ranges(((0, 10),), ((10, 20),)) == ()
    assert intersect_ranges(((0, 100),), ((1, 2), (3, 4), (99, 200))) == ((1, 2), (3, 4), (99, 100))


class _FullHead(torch.nn.Module):
    """The same LM whose compute_logits computes every id (the engine then masks before sampling)."""

    def __init__(self, lm):
        super().__init__()
        self.lm, self.config = lm, lm.config

    def forward(self, *args, **kwargs):
        return self.lm(*args, **kwargs)

    def compute_logits(self, hidden):
        return self.lm.compute_logits(hidden)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0, repetition_penalty=1.3),
                                      SamplingParams(temperature=0.9, top_p=0.9, seed=5)])
def test_per_row_head_draws_what_the_full_head_draws_in_a_mixed_batch(lm_path, sampling):
    """Requests at different stream positions share a step: one matmul group per range layout, same draws."""

    def ranges(n: int) -> list[tuple[int, int]]:
        lo = 100 + (n % 3) * 100
        return [(lo, lo + 100), (7, 8)]

    def run(model) -> dict[str, list[int]]:
        eng = KVCacheEngine("lm", model, "cpu", "float32", KVOptions(num_blocks=64))
        out: dict[str, list[int]] = {f"r{i}": [] for i in range(3)}
        for i, rid in enumerate(out):  # r1 starts one step after r0, r2 two: their positions differ
            for _ in range(i):
                for result in eng.step():
                    got = int(result.outputs["token"][0])
                    out[result.firing.request_id].append(got)
                    eng.submit(_firing(result.firing.request_id, [got], ranges, sampling))
            eng.submit(_firing(rid, [3, 14, 15, 92 + i], ranges, sampling))
        while min(len(v) for v in out.values()) < 9:
            for result in eng.step():
                assert result.error is None, result.error
                got = int(result.outputs["token"][0])
                out[result.firing.request_id].append(got)
                eng.submit(_firing(result.firing.request_id, [got], ranges, sampling))
        return {rid: tokens[:9] for rid, tokens in out.items()}

    model = load_causal_lm(lm_path, progress=False)
    per_row = run(model)
    assert per_row == run(_FullHead(model))
    for tokens in per_row.values():
        assert all(t == 7 or 100 + (n % 3) * 100 <= t < 200 + (n % 3) * 100 for n, t in enumerate(tokens)), tokens
