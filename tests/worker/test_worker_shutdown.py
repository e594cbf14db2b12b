"""A worker that is told to stop closes its engines (Engine.close runs once, at shutdown)."""

from __future__ import annotations

import threading

import zmq

from tests.worker.test_compute import Closing
from walkserve.protocol import messages as m
from walkserve.protocol.run import RankSite, RunSpec
from walkserve.testing.fixtures.lm import build_graph
from walkserve.transport.ipc import Outbox
from walkserve.worker.worker import Worker


def test_stop_message_closes_the_engines(tmp_path):
    spec = RunSpec("r0test", "token", str(tmp_path), "fixture-lm", None, {}, {}, "<test>")
    engine = Closing()
    site = RankSite(spec.address("rank0"), spec.conductor_address, "local")
    worker = Worker(spec, 0, build_graph(), {"lm": engine}, site)
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
    assert engine.closed == 1
