"""The conductor's timing records: admission and queue wait, and each walk until the next one or the end."""

from __future__ import annotations

import time

from walkserve.conductor.timing import RequestTimes


def test_walks_close_at_the_next_walk_and_at_the_end():
    times = RequestTimes()
    before = time.time_ns()
    times.admitted("r", 0.5, before)
    times.walk("r", "prefill", {"lm": 0})
    times.walk("r", "decode", {"lm": 0, "codec": 1})
    times.end("r")
    times.end("r")  # a second end records nothing
    records = times.take().records
    assert [(r.kind, r.name) for r in records] == [("admission", "admission"), ("queue", "queue"),
                                                  ("walk", "prefill"), ("walk", "decode")]
    admission, queue, prefill, decode = records
    assert queue.start_ns == admission.start_ns == before - 500_000_000 and queue.end_ns == before
    assert prefill.end_ns == decode.start_ns and decode.attrs == {"rank.codec": 1, "rank.lm": 0}
    assert all(r.request_ids == ["r"] for r in records) and times.take() is None
