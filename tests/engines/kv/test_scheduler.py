"""Scheduler bookkeeping on plain ints: budget, chunking, decode priority, prefix hits, preemption."""

from __future__ import annotations

from dataclasses import dataclass

from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.scheduler import Scheduler, SchedulerConfig


@dataclass
class FakeFiring:
    name: str
    outputs: tuple[str, ...] = ("token",)


def _sched(num_blocks=16, block_size=4, max_batch_tokens=8, max_running=8) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), SchedulerConfig(max_batch_tokens, max_running))


def _submit(s: Scheduler, req: str, tokens: list[int], tag: str = "main") -> FakeFiring:
    ctx = s.context((req, tag))
    firing = FakeFiring(f"{req}:{len(ctx.token_ids) + len(tokens)}")  # named after where its tokens end
    ctx.append(firing, tokens)
    return firing


def _run(s: Scheduler) -> tuple[list[tuple[str, int, int]], list[str]]:
    """One step: the plan as (request, start, n) and the names of the answered firings."""
    plan = s.schedule()
    chunks = [(c.context.key[0], c.start, c.num_tokens) for c in plan.chunks]
    done = [p.firing.name for _, p in s.finish(plan)]
    s.bm.check()
    return chunks, done


def test_long_prompt_runs_in_chunks_and_is_answered_after_the_last():
    s = _sched()
    _submit(s, "a", list(range(20)))
    assert _run(s) == ([("a", 0, 8)], [])
    assert _run(s) == ([("a", 8, 8)], [])
    assert _run(s) == ([("a", 16, 4)], ["a:20"])
    assert _run(s) == ([], [])
    assert s.bm.table(("a", "main")) == [0, 1, 2, 3, 4]


def test_decodes_go_first_and_prefill_takes_the_rest_of_the_budget():
    s = _sched()
    _submit(s, "a", [1, 2, 3])
    _run(s)
    _submit(s, "b", list(range(10, 30)))  # a 20-token prompt joins
    _submit(s, "a", [4])  # a's decode
    assert _run(s) == ([("a", 3, 1), ("b", 0, 7)], ["a:4"])
    _submit(s, "a", [5])
    assert _run(s) == ([("a", 4, 1), ("b", 7, 7)], ["a:5"])
    assert _run(s) == ([("b", 14, 6)], ["b:20"])


def test_max_running_caps_the_batch():
    s = _sched(max_batch_tokens=100, max_running=2)
    for req in "abc":
        _submit(s, req, [1, 2])
    assert [c[0] for c in _run(s)[0]] == ["a", "b"]
    assert [c[0] for c in _run(s)[0]] == ["c"]


def test_firings_queued_on_one_context_are_answered_in_order():
    s = _sched(max_batch_tokens=100)
    first = _submit(s, "a", [1, 2, 3])  # a prefill that only fills the KV
    first.outputs = ()
    _submit(s, "a", [4])  # its next token is asked for right away
    assert _run(s) == ([("a", 0, 3)], ["a:3"])
    assert _run(s) == ([("a", 3, 1)], ["a:4"])


def test_prefix_hits_skip_cached_blocks_but_keep_the_last_token():
    s = _sched(max_batch_tokens=100)
    prompt = list(range(12))  # exactly three blocks
    _submit(s, "a", prompt)
    _run(s)
    _submit(s, "b", prompt + [50, 51])
    assert _run(s) == ([("b", 12, 2)], ["b:14"])
    assert s.bm.table(("b", "main"))[:3] == s.bm.table(("a", "main"))
    _submit(s, "c", prompt)  # identical prompt: the last block is recomputed for its logits
    assert _run(s) == ([("c", 8, 4)], ["c:12"])
    assert s.prefix_hit_tokens == 12 + 8


def test_running_context_preempts_idle_holders_latest_first():
    s = _sched(num_blocks=6, block_size=4, max_batch_tokens=100)
    _submit(s, "a", list(range(100, 108)))
    _submit(s, "b", list(range(8)))
    _submit(s, "c", list(range(8)))  # b's prompt in the same step: nothing is cached yet, no hit
    _run(s)
    assert [s.bm.table((r, "main")) for r in "abc"] == [[0, 1], [2, 3], [4, 5]] and s.bm.num_free == 0
    _submit(s, "a", list(range(108, 113)))  # 5 more tokens: 2 blocks needed, none free
    assert _run(s) == ([("a", 8, 5)], ["a:13"])
    assert s.preemptions == 1 and not s.bm.has(("c", "main")) and s.bm.has(("b", "main"))
    assert s.bm.table(("a", "main")) == [0, 1, 5, 4]  # c's blocks were duplicates, never cached: freed tail first


def test_running_contexts_preempt_later_ones_and_the_victim_resumes():
    s = _sched(num_blocks=4, block_size=2, max_batch_tokens=100)
    _submit(s, "a", [1, 2, 3, 4])
    _submit(s, "b", [5, 6, 7, 8])
    assert _run(s) == ([("a", 0, 4), ("b", 0, 4)], ["a:4", "b:4"])
    _submit(s, "a", [9])
    _submit(s, "b", [10])
    # a needs a block, none is free, nothing is idle: the later b is preempted (and not readmitted this step)
    assert _run(s) == ([("a", 4, 1)], ["a:5"])
    assert s.preemptions == 1 and s.num_waiting() == 1
    assert s.bm.table(("a", "main")) == [0, 1, 3]  # b's tail block (3) was evicted first
    # b comes back: its head block is still cached, and idle a is preempted since nothing else runs
    assert _run(s) == ([("b", 2, 3)], ["b:5"])
    assert s.preemptions == 2 and s.prefix_hit_tokens == 2
    assert not s.bm.has(("a", "main")) and s.bm.table(("b", "main")) == [2, 3, 1]


def test_a_context_short_of_blocks_shrinks_its_chunk():
    s = _sched(num_blocks=4, block_size=2, max_batch_tokens=100)
    _submit(s, "x", [1, 2])
    _submit(s, "y", [3, 4])
    _run(s)  # x: [0], y: [1]
    _submit(s, "x", [5])
    _submit(s, "y", [6, 7, 8, 9, 10])  # y needs 3 blocks; x's decode takes one of the 2 free first
    assert _run(s) == ([("x", 2, 1), ("y", 2, 2)], ["x:3"])  # y cannot preempt the earlier x: it shrinks
    assert s.preemptions == 0
    assert _run(s) == ([("y", 4, 3)], ["y:7"])  # now x is idle and gets preempted
    assert s.preemptions == 1 and not s.bm.has(("x", "main"))


def test_a_context_that_fits_nowhere_preempts_itself():
    s = _sched(num_blocks=4, block_size=2, max_batch_tokens=100)
    _submit(s, "a", [1, 2, 3, 4])
    _submit(s, "b", [5, 6])
    _run(s)  # a: [0, 1], b: [2]
    _submit(s, "a", [7])
    _submit(s, "b", [8, 9, 10, 11, 12])
    # a's decode takes the last block; b (later, its block full) cannot preempt a: it preempts itself
    assert _run(s) == ([("a", 4, 1)], ["a:5"])
    assert s.preemptions == 1 and not s.bm.has(("b", "main")) and s.num_waiting() == 1
    # next step nothing runs: b reattaches its cached block and preempts idle a
    assert _run(s) == ([("b", 2, 5)], ["b:7"])
    assert s.bm.table(("b", "main")) == [2, 3, 1, 0] and s.preemptions == 2


def test_waiting_context_preempts_idle_ones_only_when_nothing_runs():
    s = _sched(num_blocks=5, block_size=2, max_batch_tokens=100)
    _submit(s, "a", [1, 2, 3, 4, 5, 6])
    _submit(s, "c", [7, 8])
    _run(s)  # a: [0, 1, 2], c: [3]; both idle
    _submit(s, "c", [9])
    _submit(s, "b", [10, 11, 12, 13])  # needs 2 blocks; c's decode takes the only free one
    assert _run(s) == ([("c", 2, 1)], ["c:3"])
    assert s.preemptions == 0 and s.num_waiting() == 1 and s.bm.has(("a", "main"))
    assert _run(s) == ([("b", 0, 4)], ["b:4"])  # nothing else runs: the latest idle holder (c) goes
    assert s.preemptions == 1 and not s.bm.has(("c", "main")) and s.bm.has(("a", "main"))
    assert s.bm.table(("b", "main")) == [4, 3]


def test_drop_request_frees_all_its_contexts():
    s = _sched()
    _submit(s, "a", [1, 2, 3], tag="cond")
    _submit(s, "a", [1, 2, 3], tag="uncond")
    _submit(s, "b", [1, 2, 3])
    _run(s)
    assert len(s.drop_request("a")) == 2
    assert list(s.contexts) == [("b", "main")] and s.bm.keys() == [("b", "main")]


_RESERVE_UNDER_O = """
from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.scheduler import Scheduler, SchedulerConfig

s = Scheduler(BlockManager(16, 4), SchedulerConfig(max_batch_tokens=8, max_running=8))
ctx = s.context(("a", "main"))
ctx.append(object(), list(range(12)))
used = []
for _ in range(2):  # step 1 admits a waiting context, step 2 extends a running one
    plan = s.schedule()
    used.append(s.bm.num_used)
    s.finish(plan)
print(*used)
"""


def test_slots_are_reserved_when_asserts_are_stripped():
    """``python -O`` drops assert statements: a reservation must never live inside one."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-O", "-c", _RESERVE_UNDER_O], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "3"]  # 8 tokens in 2 blocks of 4, then all 12 in 3


def test_when_the_batch_is_full_the_most_urgent_go_first_not_the_first_admitted():
    """The rank offers its members least slack first (``urge`` in that order): a full step takes them in that
    order; work offered in an earlier call (in flight) goes before this call's."""
    s = _sched(max_batch_tokens=100, max_running=2)
    for req in "abc":
        _submit(s, req, [1, 2])
    for req in "cab":  # c is about to gap, a next; b has slack to spare
        s.urge(req)
    assert [c[0] for c in _run(s)[0]] == ["c", "a"]
    assert [c[0] for c in _run(s)[0]] == ["b"]
    for req in "abc":  # decodes, offered in the order b, c, a
        _submit(s, req, [3])
    for req in "bca":
        s.urge(req)
    assert [c[0] for c in _run(s)[0]] == ["b", "c"]
    for req in "cb":  # the next decodes of c and b, offered after a's, which still waits: a goes first now
        _submit(s, req, [4])
        s.urge(req)
    assert [c[0] for c in _run(s)[0]] == ["a", "c"]
    s.drop_request("b")
    assert "b" not in s.urgency


def test_an_urgent_prompt_takes_the_prefill_budget_first():
    s = _sched(max_batch_tokens=8)
    _submit(s, "text", list(range(20)))  # admitted first: a long prompt
    _submit(s, "stream", list(range(100, 108)))  # a stream's prompt: its first audio waits on it
    s.urge("stream")
    s.urge("text")
    assert _run(s) == ([("stream", 0, 8)], ["stream:8"])
    assert _run(s)[0] == [("text", 0, 8)]


def test_a_request_with_many_contexts_takes_half_a_step_before_the_others_have_their_turn():
    """A fan of 6 member contexts (held, with work) and, admitted later, another request's held decode and a new
    request's prompt (waiting): with max_running 4 the fan takes 2 chunks, the others theirs, the fan the rest;
    alone, the fan fills the step. (Before, the fan took all 4 and the others waited for its last member.)"""
    s = _sched(num_blocks=32, max_batch_tokens=100, max_running=4)
    _submit(s, "d", [1, 2])
    for k in range(6):
        _submit(s, "fan", [1, 2, 3], tag=f"cand[{k}]")
    while _run(s)[0]:
        pass
    for k in range(6):
        _submit(s, "fan", [4, 5, 6], tag=f"cand[{k}]")
    _submit(s, "d", [3])  # a decode of a request admitted before
    _submit(s, "new", [7, 8])  # a prompt of a request admitted after
    assert _run(s)[0] == [("d", 2, 1), ("fan", 3, 3), ("fan", 3, 3), ("new", 0, 2)]
    assert _run(s)[0] == [("fan", 3, 3)] * 4
    assert _run(s)[0] == []


def test_a_new_request_takes_the_pool_from_idle_members_of_a_request_that_holds_more_than_its_share():
    """A full pool: 6 fan members hold a block each, 2 of them run a next step into the last 2 blocks. A new
    request's prompt preempts the latest idle member (the fan holds blocks for 6 > 2 contexts) and runs in the same
    step, instead of waiting for a step with nothing else in it (before, it waited for the fan's step to end)."""
    s = _sched(num_blocks=8, max_batch_tokens=100, max_running=4)
    for k in range(6):
        _submit(s, "fan", [1, 2, 3, 4], tag=f"cand[{k}]")
    while _run(s)[0]:
        pass
    for k in range(2):
        _submit(s, "fan", [5, 6, 7, 8], tag=f"cand[{k}]")
    _submit(s, "new", [9, 9, 9])
    assert _run(s)[0] == [("fan", 4, 4), ("fan", 4, 4), ("new", 0, 3)]
    assert not s.bm.has(("fan", "cand[5]")) and s.preemptions == 1
