"""A worker that is told to stop closes its engines (Engine.close runs once, at shutdown, after the last step)."""

from __future__ import annotations

import threading

import zmq

from tests.worker.test_cohort import Copy
from walkserve.engines.base import Group
from walkserve.placement.plan import parse_placement
from walkserve.protocol import messages as m
from walkserve.protocol.run import RankSite, RunSpec
from walkserve.testing.fixtures.lm import build_graph
from walkserve.transport.ipc import Outbox
from walkserve.worker.worker import Worker


class Closing(Copy):
    """Counts close() calls and notes whether a call ever ran after one."""

    component = "lm"

    def __init__(self) -> None:
        super().__init__()
        self.closed = 0
        self.used_after_close = False

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list:
        self.used_after_close |= self.closed > 0
        return super().run_groups(groups, may_yield)

    def close(self) -> None:
        self.closed += 1


def test_stop_message_closes_the_engines(tmp_path):
    spec = RunSpec("r0test", "token", str(tmp_path), "fixture-lm", None, {}, {}, "<test>")
    placement = parse_placement({"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]}, "<test>")
    engine = Closing()
    site = RankSite(spec.address("rank0"), spec.conductor_address, "local")
    worker = Worker(spec, 0, build_graph(), {"lm": engine, "also-lm": engine}, site, placement)  # one engine, two names
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    ctx = zmq.Context()
    out = Outbox(ctx, spec.token)
    out.connect("rank", spec.address("rank0"))
    out.send_now("rank", m.Stop())
    thread.join(10)
    out.close()
    ctx.term()
    assert not thread.is_alive()
    assert engine.closed == 1 and not engine.used_after_close
