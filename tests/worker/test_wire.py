"""A split step's rows on the wire: one stacked payload per edge and peer, each member given its own row.

Two ranks in one process (``a`` on rank 0, ``b`` on rank 1, the carry ``b.x -> a.x`` and the stop rule's
decision going back), every frame between them through the worker's real path: ``wire.pack``, the codec,
``wire.unpack_message``, ``Executor.receive``.
"""

from __future__ import annotations

import zlib
from collections import defaultdict

import pytest

from walkserve.core.request import RequestSpec
from walkserve.engines.base import Group
from walkserve.engines.values import concat, to_array, to_tensor
from walkserve.models.base import ModelRef
from walkserve.protocol import codec
from walkserve.protocol import messages as m
from walkserve.testing.fixtures.base import FixtureParams
from walkserve.testing.fixtures.bench import NullBench
from walkserve.testing.simulator import GroupOnlyEngine, Simulator
from walkserve.transport.tensors import TensorCodec
from walkserve.worker import wire
from walkserve.worker.executor import Executor
from walkserve.worker.outgoing import CONDUCTOR

BATCH, STEPS, TOKEN = 64, 5, "run-token"


class _Mix(GroupOnlyEngine):
    """a: y = 2x + (a number of the request); b: x = y + 1. Each member's outputs depend on its own rows."""

    def __init__(self, component: str):
        self.component = component

    def run_group(self, group: Group) -> list:
        if self.component == "a":
            return [{"y": inp["x"] * 2 + zlib.crc32(rid.encode()) % 1000}
                    for rid, inp in zip(group.request_ids, group.inputs, strict=True)]
        return [{"x": inp["y"] + 1} for inp in group.inputs]


class _WireSim(Simulator):
    """Frames between ranks go through the wire path; ``per_row`` sends each Values row as its own message."""

    def __init__(self, ranks: dict[str, int], per_row: bool = False):
        graph = NullBench(ModelRef("fixture-bench-null", None, {})).graph()
        super().__init__(graph, {}, lambda walk, node: ranks[node], seed=3)
        self.per_row = per_row
        self.codecs: dict[int, TensorCodec] = {}
        self.values_sent: list[tuple[int, m.Values]] = []  # (rank, Values as packed)

    def executor(self, rank: int):
        if rank not in self.executors:
            engines = {c: _Mix(c) for c in ("a", "b")}
            self.executors[rank] = Executor(rank, self.graph, engines, concat, self.placement, True, (to_array, to_tensor))
            self.codecs[rank] = TensorCodec(TOKEN, str(rank), use_shm=False)
        return self.executors[rank]

    def run(self, max_steps: int = 100_000) -> dict:
        """Lockstep: every message in flight delivered, then a pass of each rank that may move."""
        for _ in range(max_steps):
            live = [k for k, q in self.channels.items() if q]
            for key in live:
                while self.channels[key]:
                    self._deliver(key, self.channels[key].popleft())
            busy = [r for r, ex in sorted(self.executors.items()) if ex.dirty]
            if not live and not busy:
                return self.results
            for rank in busy:
                self._tick(rank)
        raise AssertionError("the loop did not finish")

    def _flush(self, rank: int) -> None:
        frames = defaultdict(list)
        for dest, msg in self.executors[rank].out.take():
            if dest == CONDUCTOR:
                self.channels[(("rank", rank), dest)].append(msg)
                continue
            for part in self._split(msg):
                packed = wire.pack(part, self.codecs[rank], inline=False)
                if isinstance(packed, m.Values):
                    self.values_sent.append((rank, packed))
                frames[dest].append(packed)
        for dest, msgs in frames.items():
            self.stats.messages += len(msgs)
            self.channels[(("rank", rank), dest)].append(codec.encode(TOKEN, msgs))

    def _split(self, msg):
        if not (self.per_row and isinstance(msg, m.Values)):
            return [msg]
        return [m.Values(msg.walk, msg.node, msg.output, [rid], [path], values=[v])
                for rid, path, v in zip(msg.request_ids, msg.paths, msg.values, strict=True)]

    def _deliver(self, key: tuple, msg) -> None:
        if not isinstance(msg, bytes):
            super()._deliver(key, msg)
            return
        rank = key[1][1]
        for part in codec.decode(msg, TOKEN):
            self.executor(rank).receive(wire.unpack_message(part))
        self._flush(rank)


def _run(sim: _WireSim) -> tuple[list[list], list[list]]:
    """Each request's client outputs as (node, path, value), and what the formula says they are."""
    for r in range(2):
        sim.executor(r)
    specs = [RequestSpec({}, params=FixtureParams(steps=STEPS)) for _ in range(BATCH)]
    for spec in specs:
        sim.submit(spec)
    results = sim.run()
    got = [[(o.node, tuple(o.path), o.value.tolist()) for o in results[s.id].outputs] for s in specs]
    return got, [_expected(s.id) for s in specs]


def _expected(rid: str) -> list:
    x, out = 1, []
    for k in range(STEPS):
        x = 2 * x + zlib.crc32(rid.encode()) % 1000 + 1
        out.append(("b", (k,), [x]))
    return out


@pytest.mark.parametrize("per_row", [False, True], ids=["one-payload", "per-row"])
def test_a_split_steps_rows_cross_as_one_payload_and_each_member_gets_its_own(per_row):
    sim = _WireSim({"a": 0, "b": 1}, per_row=per_row)
    got, expected = _run(sim)
    assert got == expected
    sent = sim.values_sent
    assert {rank for rank, _ in sent} == {0, 1}  # a.y to rank 1, the carry b.x back to rank 0
    for _, msg in sent:
        assert msg.values == []  # the rows travel in the stacked payload, none as a tensor of its own
        assert msg.stacked is not None and msg.stacked.shape[0] == len(msg.request_ids)
    if per_row:
        assert all(len(msg.request_ids) == 1 for _, msg in sent)
    else:  # the members step in lockstep: a step's rows for the peer are one message of all 64
        assert all(len(msg.request_ids) == BATCH for _, msg in sent)
        assert len(sent) == 2 * STEPS  # one each way per step


def test_the_split_loop_gives_what_the_same_loop_gives_on_one_rank():
    for ranks in ({"a": 0, "b": 1}, {"a": 0, "b": 0}):
        got, expected = _run(_WireSim(ranks))
        assert got == expected, ranks
