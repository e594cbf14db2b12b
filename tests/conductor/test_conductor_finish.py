"""The conductor's end of a request: an abort and a stop-string stop free the run the same way, and are
counted apart (a stop string is a finished request)."""

from __future__ import annotations

import pytest

from walkserve.conductor.conductor import Conductor
from walkserve.core.array import ArrayData
from walkserve.core.request import RequestSpec
from walkserve.placement import parse_placement
from walkserve.protocol import messages as m
from walkserve.protocol.run import RunSpec
from walkserve.testing.fixtures.lm import build_graph


@pytest.fixture
def conductor(tmp_path):
    spec = RunSpec("r0unit", "token", str(tmp_path), "fixture-lm", None, {}, {}, "<test>")
    place = parse_placement({"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]})
    c = Conductor(spec, build_graph(), place)  # sockets bound in tmp_path; no worker is started
    yield c
    c.inbox.close()
    c.outbox.close()
    c.ctx.term()


def _start(c: Conductor, rid: str) -> None:
    c.start_request(RequestSpec({"prompt_ids": ArrayData.from_list([3, 4])}, id=rid), 0.0)


@pytest.mark.parametrize("reason, finish, counter", [("abort", "abort", "aborted"), ("stop", "stop", "finished")])
def test_abort_ends_the_run_with_its_reason(conductor, reason, finish, counter):
    _start(conductor, "a")
    assert conductor.load[0] == 1
    conductor.outbox.pending.clear()
    conductor.on_abort(m.Abort("a", reason))
    assert "a" not in conductor.runs and conductor.load[0] == 0
    assert dict(conductor.counters) == {counter: 1, "start_walks": 1}
    [finished] = conductor.outbox.pending["frontend"]
    assert (finished.request_id, finished.reason) == ("a", finish)
    assert conductor.outbox.pending[("rank", 0)] == [m.Release("a")]
    conductor.on_abort(m.Abort("a"))  # the frontend's own abort when it closes the stream: nothing left to end
    assert dict(conductor.counters) == {counter: 1, "start_walks": 1}


def test_a_queued_request_that_is_aborted_never_starts(conductor):
    conductor.admission.enqueue(RequestSpec({}, id="q"))
    conductor.on_abort(m.Abort("q"))
    assert not conductor.admission.queue and conductor.counters["aborted"] == 1
