"""A loop split over two workers: one frame per step from rank to rank, over the node's datagram sockets."""

from __future__ import annotations

import pytest

from tests.runtime.conftest import placement, start, wait_until
from walkserve.core.request import RequestSpec
from walkserve.testing.fixtures.base import FixtureParams

STEPS, BATCH = 12, 8


@pytest.mark.parametrize("direct", [True, False], ids=["datagrams", "zeromq"])
def test_a_split_step_sends_one_frame_each_way_for_all_its_members(direct):
    """a on rank 0, b on rank 1 (the carry and the stop rule's decision go back): 8 requests in lockstep for
    12 steps send 12 frames a -> b and 12 back, not one per request, through datagrams when direct_peers is on."""
    place = placement(2, {"a": 0, "b": 1})
    with start("fixture-bench-null", place, direct_peers=direct) as engine:
        results = engine.run([RequestSpec({}, params=FixtureParams(steps=STEPS)) for _ in range(BATCH)])
        assert [len(r.events) for r in results] == [STEPS] * BATCH

        def sent() -> dict:
            engine.stats()
            workers = engine.status.stats.workers
            return {(r, peer): s for r, w in workers.items() for peer, s in w.sent_to.items()}

        assert wait_until(lambda: all(s.get("frames", 0) >= STEPS for s in sent().values()) and len(sent()) == 2)
        for (rank, peer), s in sent().items():
            assert s["frames"] <= STEPS + 1, (rank, peer, s)  # a step's rows for all 8 members in one frame
            assert s["messages"] >= s["frames"]
            assert s["direct_frames"] == (s["frames"] if direct else 0), (rank, peer, s)
