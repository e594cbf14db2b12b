"""The conductor's reports to the frontend: a rank that cannot start fails the run through RankFailed, and the
Status it publishes carries typed stats keyed by int rank."""

from __future__ import annotations

import pytest

from walkserve.conductor.conductor import Conductor
from walkserve.placement import parse_placement
from walkserve.protocol import messages as m
from walkserve.protocol.codec import decode, encode
from walkserve.protocol.run import RunSpec
from walkserve.testing.fixtures.lm import build_graph


@pytest.fixture
def conductor(tmp_path):
    spec = RunSpec("r0unit", "token", str(tmp_path), "fixture-lm", None, {}, {}, "<test>")
    ranks = [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}]
    place = parse_placement({"ranks": ranks, "nodes": [{"nodes": ["lm"], "ranks": [0, 1]}]})
    c = Conductor(spec, build_graph(), place)  # sockets bound in tmp_path; no worker is started
    yield c
    c.inbox.close()
    c.outbox.close()
    c.ctx.term()


def _statuses(c: Conductor) -> list[m.Status]:
    return [x for x in c.outbox.pending["frontend"] if isinstance(x, m.Status)]


def test_a_rank_that_cannot_start_fails_the_run_with_its_reason(conductor):
    conductor.handle(m.RankFailed(1, "rank 1 could not start: OSError: no device"))
    assert (conductor.state, conductor.detail) == ("failed", "rank 1 could not start: OSError: no device")
    [status] = _statuses(conductor)
    assert (status.state, status.detail) == ("failed", "rank 1 could not start: OSError: no device")


def test_a_failed_request_is_never_read_as_a_rank(conductor):
    conductor.handle(m.Failed("rank:1", "boom"))  # no such request: nothing to end, and no rank failed
    assert conductor.state == "starting" and not _statuses(conductor)


def test_status_carries_each_rank_report_typed_and_keyed_by_int(conductor):
    report = m.RankStats(walk_states=2, counters={"firings": 5}, shm_to={0: 3})
    conductor.handle(m.WorkerStats(1, report))
    conductor.counters["finished"] += 4
    conductor.publish_status(force=True)
    [status] = decode(encode("t", _statuses(conductor)), "t")
    assert status.stats.workers == {1: report} and status.stats.counters == {"finished": 4}
    assert (status.stats.running, status.stats.waiting, status.stats.launcher) == (0, 0, "local")
    assert status.stats.restarts == {0: 0, 1: 0} and status.workers == {0: False, 1: False}


def test_a_worker_that_cannot_start_reports_its_rank_to_the_conductor(conductor):
    from walkserve.protocol.run import RankSite
    from walkserve.worker.main import _report_start_failure

    site = RankSite(inbox="", conductor=conductor.inbox.address, node="n")
    _report_start_failure(site, conductor.spec, 1, OSError("no device"))
    assert conductor.inbox.poll(5000)
    [report] = conductor.inbox.receive()
    assert report == m.RankFailed(1, "rank 1 could not start: OSError: no device")
    conductor.handle(report)
    assert conductor.state == "failed" and _statuses(conductor)[-1].detail == report.reason
