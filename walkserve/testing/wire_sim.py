"""Ranks in one process, stepped in lockstep, their frames through the worker's real wire path.

Every message between two ranks goes as a worker sends it: ``wire.pack`` (rows
stacked), the codec's frame, then ``wire.unpack_message`` and
``Executor.receive`` on the other side. No processes, no sockets, no waiting:
what a split placement costs in the executors and on the wire alone
(``./dev bench runtime`` prints it beside the real runtimes; the wire tests
check each member gets its own rows). A rank hands its rows for other ranks
off mid-pass as a worker does (``Effects.hand_off``), so a frame may leave
before the pass ends. The conductor's side is the simulator's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from walkserve.engines.base import Engine
from walkserve.engines.values import concat, to_array, to_tensor
from walkserve.graph.walk import WalkGraph
from walkserve.protocol import codec
from walkserve.testing.simulator import Simulator
from walkserve.transport.tensors import TensorCodec
from walkserve.worker import wire
from walkserve.worker.executor import Executor
from walkserve.worker.outgoing import CONDUCTOR

TOKEN = "run-token"


class WireSimulator(Simulator):
    """``engines(rank)``: that rank's engines by component; ``ranks``: node -> rank."""

    def __init__(self, graph: WalkGraph, ranks: Mapping[str, int], engines: Callable[[int], dict[str, Engine]]):
        super().__init__(graph, {}, lambda walk, node: ranks[node], seed=3)
        self.engines_of = engines
        self.codecs: dict[int, TensorCodec] = {}

    def executor(self, rank: int) -> Executor:
        if rank not in self.executors:
            ex = self.executors[rank] = self.new_executor(rank, self.engines_of(rank))
            self.codecs[rank] = TensorCodec(TOKEN, str(rank), use_shm=False)
            ex.fx.hand_off = lambda: self.handed_off(rank, ex.out.take_ranks())
        return self.executors[rank]

    def new_executor(self, rank: int, engines: dict[str, Engine]) -> Executor:
        return Executor(rank, self.graph, engines, concat, self.placement, True, (to_array, to_tensor))

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

    def parts(self, msg: Any) -> list:
        """The messages ``msg`` goes as (a subclass may send its rows apart)."""
        return [msg]

    def packed(self, rank: int, msg: Any) -> None:
        """``msg`` left ``rank`` packed (for a subclass that looks at what went)."""

    def handed_off(self, rank: int, messages: list) -> None:
        """Mid-pass, ``rank``'s rows for other ranks leave as the worker's would (``Effects.hand_off_now``)."""
        self._frames(rank, messages)

    def _flush(self, rank: int) -> None:
        self._frames(rank, self.executors[rank].out.take())

    def _frames(self, rank: int, messages: list) -> None:
        frames = defaultdict(list)
        for dest, msg in messages:
            if dest == CONDUCTOR:
                self.channels[(("rank", rank), dest)].append(msg)
                continue
            for part in self.parts(msg):
                packed = wire.pack(part, self.codecs[rank], inline=False)
                self.packed(rank, packed)
                frames[dest].append(packed)
        for dest, msgs in frames.items():
            self.stats.messages += len(msgs)
            self.channels[(("rank", rank), dest)].append(codec.encode(TOKEN, msgs))

    def _deliver(self, key: tuple, msg: Any) -> None:
        if not isinstance(msg, bytes):
            super()._deliver(key, msg)
            return
        rank = key[1][1]
        for part in codec.decode(msg, TOKEN):
            self.executor(rank).receive(wire.unpack_message(part))
        self._flush(rank)
