"""EngineSet's timing records: one ``node`` record per group of an engine call, none when the log is off."""

from __future__ import annotations

import pytest

from walkserve.engines.base import Group
from walkserve.protocol.timing import TimingLog
from walkserve.worker.engine_set import EngineSet


class Echo:
    component = "lm"

    def run_groups(self, groups, may_yield=False):
        return [[{"out": rid} for rid in g.request_ids] for g in groups]


def group(node: str, rids: list[str]) -> Group:
    n = len(rids)
    return Group("guided", node, "lm", "forward", ("out",), {}, rids, [(i,) for i in range(n)], [{}] * n, [{}] * n, [None] * n)


def test_one_node_record_per_group_with_the_whole_calls_batch():
    engines = EngineSet({"lm": Echo()})
    engines.timing = TimingLog(3)
    engines.call(engines["lm"], [group("cond", ["a", "b"]), group("uncond", ["a"])])
    msg = engines.timing.take()
    assert msg.rank == 3 and engines.timing.take() is None
    assert [(r.kind, r.name, r.walk, r.request_ids, r.attrs) for r in msg.records] == [
        ("node", "cond", "guided", ["a", "b"], {"component": "lm", "batch": 3}),
        ("node", "uncond", "guided", ["a"], {"component": "lm", "batch": 3})]
    assert msg.records[0].start_ns == msg.records[1].start_ns <= msg.records[0].end_ns


def test_no_log_no_records():
    engines = EngineSet({"lm": Echo()})
    assert engines.call(engines["lm"], [group("cond", ["a"])]) == [[{"out": "a"}]]
    assert engines.timing is None


def test_step_counts_per_node_and_batch_bucket_split_a_shared_calls_seconds_by_members():
    ticks = iter([0.0, 0.3, 1.0, 1.1])  # the first call takes 0.3 s, the second 0.1 s
    engines = EngineSet({"lm": Echo()}, clock=lambda: next(ticks))
    engines.call(engines["lm"], [group("cond", ["a", "b"]), group("uncond", ["a"])])
    engines.call(engines["lm"], [group("cond", ["c"])])
    counts = engines.costs.count_snapshot()
    # node -> bucket -> [steps, members, busy s]: cond's 2 of the 3 members took 0.2 s of the shared call
    assert counts["cond"][2] == pytest.approx([1.0, 2.0, 0.2])
    assert counts["cond"][1] == pytest.approx([1.0, 1.0, 0.1])
    assert counts["uncond"] == {1: pytest.approx([1.0, 1.0, 0.1])}
    # the scheduler's step estimate stays the whole call: a node's step lasts as long as the call it is in
    assert engines.costs.estimate("cond", 2) == pytest.approx(0.3)
