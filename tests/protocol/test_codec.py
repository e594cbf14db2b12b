"""The codec: every message survives a round trip; a wrong token, garbage or a pickle is refused."""

from __future__ import annotations

import pickle

import msgspec
import pytest

from walkserve.core.array import ArrayData
from walkserve.core.params import Params
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.protocol import messages as m
from walkserve.protocol.arrays import array_rows, event_values, plain_value, wire_value
from walkserve.protocol.codec import BadMessage, decode, encode


class RolloutParams(Params, frozen=True, tag="test.rollout"):
    horizon: int = 4
    window: tuple[int, int] = (0, 1)
    label: str | None = None


class PlainParams(Params, frozen=True):  # no tag given: the class name is the tag
    steps: int = 2


TENSOR = m.TensorMsg("float32", (2, 2), data=bytes(16), nbytes=16)
ONE_OF_EACH = [
    m.Submit(RequestSpec({"prompt": ArrayData.from_list([1, 2])}, sampling=SamplingParams(max_tokens=3), id="r1",
                         params=RolloutParams(horizon=7, window=(2, 5), label="x"))),
    m.Abort("r1"), m.Abort("r1", "stop"), m.Shutdown(2.5), m.StatusQuery(4),
    m.Events("decode", "lm", "text", "token", ["r1", "r2"], [(1,), (2,)], [0, 1], stacked=TENSOR),
    m.Finished("r1", "stop", None, {"firings": 3}, {"total_s": 0.5}), m.Rejected("r2", "full", 2.0, invalid=False),
    m.Status("ready", "serving", {0: True}, m.RuntimeSnapshot(running=1, workers={0: m.RankStats(walk_states=2)}), 4),
    m.StartWalk("r1", "prefill", {"lm": 0}, {"prompt": TENSOR}, PlainParams(steps=3), SamplingParams(max_tokens=3)),
    m.Release("r1"), m.Stop(), m.StatsQuery(), m.MoveContexts("r1", {"lm": ["main"]}, 1),
    m.Contexts("r1", 0, [m.ContextState("main", "lm", [1, 2], [2], [m.SegmentState(0, 2, "causal", 0, 0, None, None, None, {}, 1)],
                                             None, 2, 1, TENSOR, TENSOR)]),
    m.Values("w", "lm", "state", ["r1", "r2"], [(0,), (1,)], stacked=TENSOR),
    m.StreamItems("w", 0, ["r1"], [()], [5], values=[9]), m.StreamEnds("w", 0, ["r1"], [()], [6]),
    m.LoopEvents("w", "loop", ["r1", "r2"], [(), ()], [2, 4], [3, -1]), m.Flows("w", 0, ["r1"], [()], [True]),
    m.ClientOuts("w", "lm", "text", "token", ["r1"], [(1,)], values=[7]), m.WalkOut("r1", "w", "state", [1, 2]),
    m.NodeDone("r1", "w", ["lm"], 4, True), m.WalkStarted("r1", "prefill", 1, False, "decode", {"lm": 0}),
    m.Failed("r1", "boom"), m.RankFailed(1, "rank 1 could not start: OSError: no device"), m.Ready(0, 123, "ipc:///x", "up"),
    m.WorkerStats(0, m.RankStats(counters={"firings": 3})), m.Peers({0: "ipc:///a", 1: "tcp://127.0.0.1:5"}),
    m.Timings(1, 4242, [m.Timing("node", "lm", "decode", 10, 20, ["r1", "r2"], {"batch": 2, "component": "lm"})]),
]


def test_every_message_kind_is_covered_and_round_trips():
    kinds = set(m.Message.__args__)
    assert {type(x) for x in ONE_OF_EACH} == kinds
    assert decode(encode("tok", ONE_OF_EACH), "tok") == ONE_OF_EACH


def test_typed_params_cross_as_their_family_struct():
    spec = RequestSpec({}, params=RolloutParams(horizon=9, window=(1, 2)), id="r9")
    start = m.StartWalk("r9", "w", {}, {}, PlainParams(), SamplingParams(), spec=spec)
    [submit, got] = decode(encode("t", [m.Submit(spec), start]), "t")
    assert type(submit.request.params) is RolloutParams and submit.request.params == RolloutParams(horizon=9, window=(1, 2))
    assert type(got.params) is PlainParams and type(got.spec.params) is RolloutParams
    assert type(decode(encode("t", [m.Submit(RequestSpec({}))]), "t")[0].request.params) is Params  # a model with none


@pytest.mark.parametrize(("params", "error"), [
    ({"family": "test.nope", "horizon": 1}, "no params class with the tag 'test.nope'"),
    ({"horizon": 1}, "no params class with the tag None"),
    ({"family": "test.rollout", "horizon": "far"}, r"Expected `int`, got `str` - at `\$\.horizon`"),
    ({"family": "test.rollout", "hops": 1}, "unknown field `hops`"),
])
def test_params_of_no_known_family_or_off_their_schema_are_refused(params, error):
    start = msgspec.to_builtins(m.StartWalk("r", "w", {}, {}, RolloutParams(), SamplingParams()))
    start[5] = params  # array_like: the tag, then the fields in order; params is the fifth field
    with pytest.raises(BadMessage, match=error):
        decode(msgspec.msgpack.encode(["t", [start]]), "t")


def test_status_stats_decode_typed_and_keyed_by_int_rank():
    snapshot = m.RuntimeSnapshot(counters={"finished": 2}, workers={1: m.RankStats(shm_to={0: 3})}, pids={1: 42},
                                 restarts={0: 0, 1: 1}, zygote_pid=7)
    [status] = decode(encode("t", [m.Status("ready", "", {1: True}, snapshot)]), "t")
    assert type(status.stats.workers[1]) is m.RankStats and status.stats.workers[1].shm_to == {0: 3}
    assert (status.stats.pids, status.stats.restarts, status.stats.zygote_pid) == ({1: 42}, {0: 0, 1: 1}, 7)
    bad = ["Status", "ready", "", {}, {"workers": {1: {"walk_states": "many"}}}, 0]
    with pytest.raises(BadMessage, match=r"Expected `int`, got `str` - at .*\.workers\[\.\.\.\]\.walk_states"):
        decode(msgspec.msgpack.encode(["t", [bad]]), "t")


def test_an_abort_is_an_abort_unless_it_says_stop():
    [plain, stop] = decode(encode("t", [m.Abort("r"), m.Abort("r", "stop")]), "t")
    assert (plain.reason, stop.reason) == ("abort", "stop")


@pytest.mark.parametrize("frame", [b"", b"\x00\x01garbage", pickle.dumps(m.Abort("r")),
                                   msgspec.msgpack.encode({"token": "t", "messages": [["Nope", 1]]})])
def test_frames_that_are_not_batches_are_refused(frame):
    with pytest.raises(BadMessage):
        decode(frame, "t")


def test_a_frame_of_another_run_is_refused():
    with pytest.raises(BadMessage, match="wrong run token"):
        decode(encode("theirs", [m.Stop()]), "ours")


def test_arrays_travel_inline_and_come_back():
    a = ArrayData.from_list([1.0, 2.0, 3.0, 4.0], "float32")
    assert plain_value(wire_value(a)) == a and wire_value(5) == 5
    stacked = m.TensorMsg("int64", (2, 1), data=ArrayData.from_list([4, 9]).data, nbytes=16)
    assert [r.tolist() for r in array_rows(stacked)] == [[4], [9]]
    assert event_values(None, [1, TENSOR]) == [1, plain_value(TENSOR)]
    with pytest.raises(ValueError, match="shared-memory"):
        plain_value(m.TensorMsg("float32", (1,), shm="ws-x", nbytes=4))
