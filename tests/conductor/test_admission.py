"""Admission: run while there is room and nobody waits, then a bounded FIFO queue, then rejection."""

from __future__ import annotations

from walkserve.conductor.admission import Admission
from walkserve.core.request import RequestSpec


def spec(i: int) -> RequestSpec:
    return RequestSpec({}, id=f"r{i}")


def test_run_then_queue_then_reject():
    a = Admission(max_running=2, max_waiting=2)
    assert [a.decide(0), a.decide(1)] == ["run", "run"]
    assert a.decide(2) == "queue"
    a.enqueue(spec(1))
    assert a.decide(0) == "queue"  # someone waits: a newcomer does not jump the queue
    a.enqueue(spec(2))
    assert a.decide(2) == "reject"


def test_the_queue_is_first_in_first_out_and_waits_for_room():
    a = Admission(max_running=1, max_waiting=4)
    for i in range(3):
        a.enqueue(spec(i))
    assert a.next_ready(1) is None
    assert [a.next_ready(0)[0].id for _ in range(3)] == ["r0", "r1", "r2"]
    assert a.next_ready(0) is None


def test_a_queued_request_can_be_removed_once():
    a = Admission(max_running=1, max_waiting=4)
    a.enqueue(spec(1))
    a.enqueue(spec(2))
    assert a.remove("r1") and not a.remove("r1") and not a.remove("r9")
    assert [s.id for s, _ in a.queue] == ["r2"]


def test_retry_after_grows_with_the_queue_within_bounds():
    a = Admission(max_running=2, max_waiting=100)
    assert a.retry_after() == 1.0
    for i in range(10):
        a.enqueue(spec(i))
    assert a.retry_after() == 5.0
    for i in range(90):
        a.enqueue(spec(100 + i))
    assert a.retry_after() == 30.0
