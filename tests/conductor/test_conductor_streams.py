"""The conductor's real-time streams: admitted by capacity (or by count), a 429 naming the cause, slots freed
at finish, a wait only within the TTFA budget, their audio counted."""

from __future__ import annotations

import pytest

from walkserve.conductor.conductor import Conductor
from walkserve.core.array import ArrayData
from walkserve.core.config import RuntimeConfig
from walkserve.core.finish import FinishReason
from walkserve.core.request import RequestSpec
from walkserve.placement import parse_placement
from walkserve.protocol import messages as m
from walkserve.protocol.run import RunSpec
from walkserve.testing.fixtures.lm import build_graph


def make(tmp_path, **config) -> Conductor:
    spec = RunSpec("r0unit", "token", str(tmp_path), "fixture-lm", None, {}, {}, "<test>", RuntimeConfig(**config))
    place = parse_placement({"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]})
    c = Conductor(spec, build_graph(), place)  # sockets bound in tmp_path; no worker is started
    c.state = "ready"
    return c


@pytest.fixture
def conductors():
    made = []
    yield made
    for c in made:
        c.inbox.close()
        c.outbox.close()
        c.ctx.term()


def stream(rid: str) -> RequestSpec:
    return RequestSpec({"prompt_ids": ArrayData.from_list([3, 4])}, id=rid, audio_rate=1000, realtime=True)


def to_frontend(c: Conductor, kind: type) -> list:
    return [msg for msg in c.outbox.pending.get("frontend", []) if isinstance(msg, kind)]


def test_a_stream_over_capacity_is_rejected_for_capacity_and_its_slot_frees_at_finish(tmp_path, conductors):
    c = make(tmp_path, max_streams=1, stream_ttfa_budget_s=0.0)
    conductors.append(c)
    c.on_submit(m.Submit(stream("a")))
    c.on_submit(m.Submit(stream("b")))
    c.on_submit(m.Submit(RequestSpec({"prompt_ids": ArrayData.from_list([3])}, id="text")))  # not a stream: runs
    assert set(c.runs) == {"a", "text"}
    [rejected] = to_frontend(c, m.Rejected)
    assert (rejected.request_id, rejected.cause) == ("b", "capacity") and rejected.retry_after_s > 0
    assert c.counters["streams_rejected_capacity"] == 1 and c.counters["streams_admitted"] == 1
    c.finish(c.runs["a"], FinishReason.LENGTH)
    c.on_submit(m.Submit(stream("c")))
    assert "c" in c.runs and c.streams.snapshot()["running"] == 1


def test_by_count_streams_are_admitted_like_any_request(tmp_path, conductors):
    c = make(tmp_path, admission="count", max_streams=1, stream_ttfa_budget_s=0.0)
    conductors.append(c)
    for rid in ("a", "b", "c"):
        c.on_submit(m.Submit(stream(rid)))
    assert set(c.runs) == {"a", "b", "c"} and not to_frontend(c, m.Rejected)
    assert c.streams.snapshot()["running"] == 3  # still tracked: the gauges and the cost model see them


def test_a_stream_waits_within_its_ttfa_budget_and_starts_when_a_slot_frees(tmp_path, conductors):
    c = make(tmp_path, max_streams=1, stream_ttfa_budget_s=5.0)
    conductors.append(c)
    c.on_submit(m.Submit(stream("a")))
    c.on_submit(m.Submit(stream("b")))  # "a" is expected to end within 1 s (no stream has finished yet)
    assert set(c.runs) == {"a"} and c.streams.snapshot()["waiting"] == 1 and not to_frontend(c, m.Rejected)
    c.finish(c.runs["a"], FinishReason.STOP)
    c.admit()
    assert set(c.runs) == {"b"} and c.counters["streams_admitted"] == 2


def test_audio_leaving_counts_for_the_stream_and_the_cost_model(tmp_path, conductors):
    c = make(tmp_path)
    conductors.append(c)
    c.on_submit(m.Submit(stream("a")))
    outs = m.ClientOuts("decode", "lm", "audio", "audio", ["a"], [()], values=[m.TensorMsg("float32", (500,))])
    c.on_client_outs(outs)
    c.on_client_outs(outs)
    assert c.streams.admission.active["a"].audio_s == pytest.approx(1.0)  # 2 x 500 samples at 1000 per second
    assert c.streams.model.audio_s == pytest.approx(1.0)
