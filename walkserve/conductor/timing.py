"""RequestTimes: the conductor's timing records of each request (when ``RuntimeConfig.timings`` is on).

    admission   Submit received -> the first walk sent, and within it ``queue``: Submit received
                -> admitted (the wait in the admission queue; microseconds when there was room)
    walk        a walk's start (StartWalk sent, or WalkStarted from a rank that went on by
                itself) -> the next walk's start, or the request's end

The records leave for the frontend with the conductor's next frame; ``take`` before a Finished,
so a request's records always precede its end.
"""

from __future__ import annotations

import time

from walkserve.protocol import messages as m
from walkserve.protocol.timing import TimingLog


class RequestTimes:
    def __init__(self) -> None:
        self.log = TimingLog(-1)
        self._walks: dict[str, tuple[str, int, dict]] = {}  # request -> (its current walk, start ns, attrs)

    def admitted(self, rid: str, queue_s: float, started_ns: int) -> None:
        """The request's first walk was sent; it reached the conductor ``queue_s`` before ``started_ns``."""
        end = time.time_ns()
        start = started_ns - int(queue_s * 1e9)
        self.log.add("admission", "admission", "", start, end, [rid], {"queue_s": queue_s})
        self.log.add("queue", "queue", "", start, started_ns, [rid], {})

    def walk(self, rid: str, walk: str, ranks: dict[str, int]) -> None:
        """``walk`` starts now for ``rid``: the walk before it ends here."""
        now = time.time_ns()
        self._close(rid, now)
        self._walks[rid] = (walk, now, {f"rank.{node}": rank for node, rank in sorted(ranks.items())})

    def end(self, rid: str) -> None:
        self._close(rid, time.time_ns())

    def _close(self, rid: str, now: int) -> None:
        open_walk = self._walks.pop(rid, None)
        if open_walk is not None:
            walk, start, attrs = open_walk
            self.log.add("walk", walk, walk, start, now, [rid], attrs)

    def take(self) -> m.Timings | None:
        return self.log.take()
