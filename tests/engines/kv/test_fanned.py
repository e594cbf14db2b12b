"""Fanned context operations: one firing over K member contexts ``cand[0..K-1]`` (V-JEPA 2-AC's CEM).

A fork fans one prefix out to K members sharing its blocks (nothing copied); a fanned append splits its
chunk into K member chunks, each run as its own chunk in the same batch, the firing answered once all
ran, outputs concatenated in member order. Each member must equal the dense, uncached pass over the
prefix and its own steps (float32, <= 1e-5).
"""

from __future__ import annotations

import torch

from tests.engines.kv.contexts_ref import Seg, dense, firing, run
from walkserve.core.options import KVOptions
from walkserve.engines.base import LATER, Group
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.graph.kv import ALL, Rows, append, fork, kv_params

TOL = {"atol": 1e-5, "rtol": 1e-5}
FRAME, TAIL, K = 6, 4, 3  # rows per step, frame rows out per step, candidates


def _engine(model) -> KVCacheEngine:
    return KVCacheEngine("lm", model, "cpu", torch.float32,
                         KVOptions(block_size=FRAME, num_blocks=64, max_batch_tokens=64, seed=0))


def _embeds(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def _seg(embeds: torch.Tensor, start: int, mask: str) -> Seg:
    n = embeds.shape[0]
    return Seg(torch.zeros(n, dtype=torch.long), torch.arange(start, start + n), mask, FRAME, embeds)


def _step_node(reset: int) -> tuple[dict, dict]:
    params = kv_params(fork("prefix", into="cand", fan="reset"),
                       append("cand", fan="k", mask="full", rows=Rows.tail(TAIL)))
    return params, {"k": torch.tensor([K]), "reset": torch.tensor([reset])}


def test_fanned_fork_and_steps_equal_each_candidate_alone(tiny_lm):
    d = tiny_lm.config.hidden_size
    engine = _engine(tiny_lm)
    prefix = _embeds(2 * FRAME, d, 1)  # two whole steps, block-causal
    f = firing("p", kv_params(append("prefix", mask="block_causal", frame=FRAME, rows=ALL)), {"embeds": prefix})
    run(engine, [f])
    bm = engine.block_manager
    used = bm.num_used
    history = [[_seg(prefix, 0, "block_causal")] for _ in range(K)]
    for step in range(3):
        chunks = [_embeds(FRAME, d, 10 * step + k) for k in range(K)]
        params, fan = _step_node(reset=K if step == 0 else 0)
        f = firing("p", params, {"embeds": torch.cat(chunks), **fan})
        out = run(engine, [f])[f.id]["hidden"]
        assert out.shape == (K * TAIL, d)
        for k in range(K):
            history[k].append(_seg(chunks[k], (2 + step) * FRAME, "full"))
            want, _ = dense(tiny_lm, [history[k]])
            torch.testing.assert_close(out[k * TAIL : (k + 1) * TAIL], want[-TAIL:], **TOL)
        # the members share the prefix's blocks: each step adds one block per candidate, nothing copied
        assert bm.num_used == used + K * (step + 1)
        bm.check()
    engine.release("p")
    assert bm.num_used == 0


def test_a_fanned_chunk_that_does_not_split_is_an_error(tiny_lm):
    d = tiny_lm.config.hidden_size
    engine = _engine(tiny_lm)
    params, fan = _step_node(reset=K)
    f = firing("bad", params, {"embeds": _embeds(K * FRAME + 1, d, 3), **fan})
    engine.submit(f)
    results = engine.step()
    assert len(results) == 1 and "do not split into 3 equal member chunks" in results[0].error
    f = firing("bad2", params, {"embeds": _embeds(K * FRAME, d, 3), "k": torch.tensor([0.5]), "reset": fan["reset"]})
    engine.submit(f)
    results = engine.step()
    assert len(results) == 1 and "must be one integer >= 1" in results[0].error


def _steps(model, num_blocks: int, steps: int = 3, k: int = 10) -> list[torch.Tensor]:
    d = model.config.hidden_size
    engine = KVCacheEngine("lm", model, "cpu", torch.float32,
                           KVOptions(block_size=FRAME, num_blocks=num_blocks, max_batch_tokens=64, seed=0))
    gen = torch.Generator().manual_seed(0)
    f = firing("p", kv_params(append("prefix", mask="block_causal", frame=FRAME, rows=ALL)),
               {"embeds": torch.randn(2 * FRAME, d, generator=gen)})
    run(engine, [f])
    params = kv_params(fork("prefix", into="cand", fan="reset"), append("cand", fan="k", mask="full", rows=Rows.tail(TAIL)))
    outs = []
    for step in range(steps):
        inputs = {"embeds": torch.randn(k * FRAME, d, generator=gen), "k": torch.tensor([k]),
                  "reset": torch.tensor([k if step == 0 else 0])}
        f = firing("p", params, inputs)
        outs.append(run(engine, [f])[f.id]["hidden"])
        engine.block_manager.check()
    return outs


def test_candidates_beyond_the_pool_are_preempted_and_recomputed_not_lost(tiny_lm):
    """10 candidates of up to 5 steps each in a pool of 8 blocks: members run in turns (the ones waiting are
    preempted and recomputed from their steps), and every step's answer equals the run with room for all."""
    for tight, roomy in zip(_steps(tiny_lm, 8), _steps(tiny_lm, 200)):
        torch.testing.assert_close(tight, roomy, **TOL)


def _fan_group(rid: str, inputs: dict, params: dict) -> Group:
    return Group("w", "lm", "lm", "forward", ("hidden",), params, [rid], [(0,)], [inputs], [{}], [None])


def test_a_fan_wider_than_a_step_yields_between_its_steps_and_other_requests_run_in_each(tiny_lm):
    """12 candidates, at most 4 chunks a step: with may_yield the fanned step answers LATER after each engine step
    (one step a call, not all it needs); a new request's step offered between its calls is answered in one call,
    its chunk beside fan members; the fan's answer equals the one from a call that runs it whole."""
    d, k = tiny_lm.config.hidden_size, 12
    gen = torch.Generator().manual_seed(0)
    prefix, chunks = torch.randn(2 * FRAME, d, generator=gen), torch.randn(k * FRAME, d, generator=gen)
    params = kv_params(fork("prefix", into="cand", fan="reset"), append("cand", fan="k", mask="full", rows=Rows.tail(TAIL)))
    fan = {"embeds": chunks, "k": torch.tensor([k]), "reset": torch.tensor([k])}
    answers = []
    for max_running in (64, 4):
        engine = KVCacheEngine("lm", tiny_lm, "cpu", torch.float32, KVOptions(
            block_size=FRAME, num_blocks=64, max_batch_tokens=128, max_running=max_running, seed=0))
        run(engine, [firing("p", kv_params(append("prefix", mask="block_causal", frame=FRAME)), {"embeds": prefix})])
        answers.append([engine.run_groups([_fan_group("p", fan, params)], may_yield=True)[0][0]])
    whole, yielded = answers
    other = kv_params(append("main", mask="full", rows=Rows.tail(TAIL)))
    for i in range(5):
        if yielded[-1] is not LATER:
            break
        step = torch.randn(FRAME, d, generator=gen)
        (got,) = engine.run_groups([_fan_group(f"o{i}", {"embeds": step}, other)], may_yield=True)[0]
        assert isinstance(got, dict), got  # answered in its own call, not LATER behind the fan
        torch.testing.assert_close(got["hidden"], dense(tiny_lm, [[_seg(step, 0, "full")]])[0][-TAIL:], **TOL)
        yielded.append(engine.run_groups([_fan_group("p", fan, params)], may_yield=True)[0][0])
    assert isinstance(whole[0], dict) and yielded[:-1] == [LATER] * 2 and isinstance(yielded[-1], dict)
    torch.testing.assert_close(yielded[-1]["hidden"], whole[0]["hidden"], **TOL)
    # members a step: 4 (fan), 3 (o0's call: 2 before o0's chunk, 1 after), 4 (fan), 1 (o1's call, beside o1's): the
    # last member ran in o1's call, so the fan's third call is answered without a step
    assert engine.stats()["forward_steps"] == 1 + 4 and engine.stats()["forward_rows.lm"] == 2 * FRAME + (k + 2) * FRAME
