"""A walk that ran wholly on a rank is followed there by the next one: no conductor round trip in between.

The conductor counts the StartWalk messages it sends and the walks workers started themselves.
"""

from __future__ import annotations

from tests.runtime.conftest import (
    comparable_events,
    comparable_reference,
    placement,
    reference,
    start,
    wait_until,
)
from walkserve.testing.fixtures.requests import fixture_request


def _counters(engine) -> dict:
    engine.stats()
    return engine.status.stats.counters


def test_prefill_then_decode_on_one_rank_sends_one_start_walk_per_request():
    requests = [fixture_request("fixture-lm", i) for i in range(1, 9)]
    two_walks = [r for r in requests if len(r.inputs["prompt_ids"].tolist()) > 1]
    assert len(two_walks) >= 4
    ref = reference("fixture-lm")
    with start("fixture-lm", placement(1, {"lm": 0})) as engine:
        results = engine.run(requests)
        for req, res in zip(requests, results, strict=True):
            assert comparable_events(res.events) == comparable_reference(ref.run(req))
        counters = wait_until(lambda: (c := _counters(engine)).get("finished") == len(requests) and c)
        assert counters["start_walks"] == len(requests)  # decode never waited for the conductor
        assert counters["walks_started_by_workers"] == len(two_walks)
