"""Block accounting under appends, forks, truncates, drops and queries: 1,000 seeded random operations, plain ints."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.ops import ContextOp
from walkserve.engines.kv.scheduler import Query, Scheduler, SchedulerConfig
from walkserve.engines.kv.sequence import PendingFiring

MAX_CONTEXT = 60  # tokens: any two contexts a query reads fit the pool together (40 blocks of 4)


@dataclass
class FakeFiring:
    name: str
    outputs: tuple[str, ...] = ()


def _exact(s: Scheduler) -> None:
    """Reference counts match the tables, and every table holds exactly the blocks its reserved slots need."""
    bm = s.bm
    bm.check()
    for key in list(bm.keys()):
        assert len(bm.table(key)) == -(-bm.num_reserved(key) // bm.block_size), key
        ctx = s.contexts[key]
        assert ctx.num_computed <= bm.num_reserved(key) <= ctx.length, key


def _step(s: Scheduler) -> None:
    plan = s.schedule()
    used = s.bm.num_used
    for c in plan.chunks:
        if c.query is not None:
            assert s.bm.num_used == used  # a query reserves nothing
    s.finish(plan)
    _exact(s)


def _settle(s: Scheduler) -> None:
    for _ in range(200):
        if not (s.queries or any(c.has_work for c in s.contexts.values())):
            return
        _step(s)
    raise AssertionError("the scheduler stopped making progress")


def _random_op(rng: random.Random, s: Scheduler, names: list[str]) -> None:
    rid = rng.choice(["r0", "r1", "r2"])
    name = rng.choice(names)
    key = (rid, name)
    kind = rng.choices(["append", "full", "query", "fork", "truncate", "drop", "step"], [6, 2, 2, 2, 2, 1, 5])[0]
    if kind in ("append", "full"):
        n = rng.randrange(1, 10)
        if key in s.contexts and s.contexts[key].length + n > MAX_CONTEXT:
            return
        op = None
        if kind == "full":
            op = ContextOp("append", name, mask="full", positions=torch.full((n,), 3), num_tokens=n)
        s.context(key).append(FakeFiring(f"{rid}:{name}"), [rng.randrange(4) for _ in range(n)], op)
        return
    if kind == "step":
        _step(s)
        return
    _settle(s)  # bookkeeping and queries need idle contexts (the engine waits for that)
    if kind == "query":
        reads = tuple(s.context((rid, r)) for r in rng.sample(names, rng.randrange(1, 3)))
        n = rng.randrange(1, 6)
        s.add_query(Query(reads, PendingFiring(FakeFiring("q"), n, 0, ContextOp("query", reads[0].key[1], num_tokens=n))))
    elif kind == "fork":
        src = (rid, rng.choice([n for n in names if n != name]))
        s.context(src)
        s.fork(src, key)
    elif kind == "truncate" and key in s.contexts:
        ctx = s.contexts[key]
        cut = rng.randrange(ctx.length + 1)
        seg = ctx.segment_at(cut) if cut < ctx.length else None
        if seg is None or (cut - seg.start) % seg.unit() == 0:
            s.truncate(key, cut)
    elif kind == "drop":
        s.drop(key)
    _exact(s)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_thousand_random_ops_give_every_block_back(prefix_caching):
    rng = random.Random(1234)
    s = Scheduler(BlockManager(40, 4, prefix_caching), SchedulerConfig(max_batch_tokens=16, max_running=6))
    names = ["gen", "cfg_text", "cfg_img"]
    for _ in range(1000):
        _random_op(rng, s, names)
    _settle(s)
    assert s.preemptions > 0  # the pool was short at times: preemption and recompute took part
    for rid in ("r0", "r1", "r2"):
        s.drop_request(rid)
    assert s.bm.num_used == 0 and not s.bm.keys() and not s.contexts
    if prefix_caching:
        assert s.bm.num_free == s.bm.num_blocks
    else:
        assert sorted(s.bm._free) == list(range(s.bm.num_blocks))
