"""Prefix reuse of content-keyed *full* appends (pi0's prefix: images and prompt that see each other both ways).

A row of a full append depends on every row of it, so its blocks are shared only
with an append equal in every row: another image anywhere in it shares nothing,
not even the blocks before that image (a causal append would share those).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tests.engines.kv.contexts_ref import firing, run
from walkserve.core.options import KVOptions
from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.engines.kv.ops import ContextOp
from walkserve.engines.kv.scheduler import Scheduler, SchedulerConfig
from walkserve.graph.kv import ALL, append, kv_params, query

D = 7  # an image's digest
IDS = [0] * 8 + [3, 4, 5, 6]  # two 4-row images (placeholder 0), then a 4-token prompt
IMAGES = [D] * 4 + [D + 1] * 4 + [0] * 4


@dataclass
class FakeFiring:
    name: str
    outputs: tuple[str, ...] = ()


def _op(ids: list[int], content: list[int]) -> ContextOp:
    rows = torch.tensor([i for i, c in enumerate(content) if c], dtype=torch.long)
    return ContextOp("append", "prefix", token_ids=torch.tensor(ids), mask="full", num_tokens=len(ids),
                     embeds=torch.zeros(len(rows), 2), embed_rows=rows, content=torch.tensor(content))


def _plan(s: Scheduler, req: str, op: ContextOp) -> list[tuple[str, int, int]]:
    s.context((req, "prefix")).append(FakeFiring(req), op.token_ids.tolist(), op)
    plan = s.schedule()
    chunks = [(c.context.key[0], c.start, c.num_tokens) for c in plan.chunks]
    s.finish(plan)
    s.bm.check()
    return chunks


def test_an_equal_full_append_attaches_every_block_but_the_last_rows():
    s = Scheduler(BlockManager(32, 4), SchedulerConfig(100, 8))
    assert _plan(s, "a", _op(IDS, IMAGES)) == [("a", 0, 12)]
    assert _plan(s, "b", _op(IDS, IMAGES)) == [("b", 8, 4)]  # the last row is always computed: its block too
    assert s.bm.table(("b", "prefix"))[:2] == s.bm.table(("a", "prefix"))[:2]
    assert s.prefix_hit_tokens == 8


@pytest.mark.parametrize("change", ["last image", "prompt", "colliding image"])
def test_a_full_append_that_differs_anywhere_shares_no_block(change):
    """Rows 0..7 are the same image rows; the second image (rows 4..7) or a prompt token (row 10) differs. A
    causal append would share block 0 (and 1); a full one shares nothing: its first rows saw the difference.
    The colliding image's digest hashes in Python as the first one's does (2**61 - 1 hashes as 0): the append's
    rows are keyed on a digest of all of them, never on ``hash()``, so block 0 is still not shared."""
    s = Scheduler(BlockManager(32, 4), SchedulerConfig(100, 8))
    _plan(s, "a", _op(IDS, IMAGES))
    ids, content = list(IDS), list(IMAGES)
    if change == "prompt":
        ids[10] = 9
    else:
        content[4:8] = [D + 2 if change == "last image" else D + 1 + 2**61 - 1] * 4
        assert (change == "colliding image") == (hash(tuple(content)) == hash(tuple(IMAGES)))
    assert _plan(s, "b", _op(ids, content)) == [("b", 0, 12)]
    assert s.prefix_hit_tokens == 0


def test_a_query_over_a_reused_full_prefix_equals_one_over_a_fresh_one(tiny_lm):
    """Request b's prefix comes from a's blocks (all but its last rows) and the rest is computed over them: the
    expert-style query that reads it gets what it gets from an engine without the prefix cache."""
    gen = torch.Generator().manual_seed(5)
    t, d = 37, tiny_lm.config.hidden_size
    ids = torch.randint(3, 500, (t,), generator=gen)
    inputs = {"tokens": ids, "embeds": torch.randn(24, d, generator=gen), "embed_rows": torch.arange(24),
              "content": torch.tensor([[11, 12]] * 24 + [[0, 0]] * (t - 24))}
    suffix = {"embeds": torch.randn(5, d, generator=gen)}
    prefix_params = kv_params(append("prefix", mask="full", content="content"))
    step_params = kv_params(query("prefix", mask="full", rows=ALL))

    def answer(engine: KVCacheEngine, rid: str) -> torch.Tensor:
        run(engine, [firing(rid, prefix_params, inputs, outputs=())])
        step = firing(rid, step_params, suffix)
        return run(engine, [step])[step.id]["hidden"]

    cached = KVCacheEngine("lm", tiny_lm, "cpu", torch.float32, KVOptions(block_size=4, num_blocks=64))
    first = answer(cached, "a")
    second = answer(cached, "b")
    assert cached.scheduler.prefix_hit_tokens == 36  # 9 of its 10 blocks (row 36, the last, is computed)
    fresh = KVCacheEngine("lm", tiny_lm, "cpu", torch.float32, KVOptions(block_size=4, num_blocks=64,
                                                                          prefix_caching=False))
    want = answer(fresh, "c")
    torch.testing.assert_close(first, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second, want, atol=1e-5, rtol=1e-5)
