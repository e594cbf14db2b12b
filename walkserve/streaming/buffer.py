"""Per-request, per-edge stream buffer at the consumer."""

from __future__ import annotations

from collections import deque
from typing import Any

from walkserve.streaming.policy import Chunk, ChunkPolicy, Span


class _Exhausted:
    def __repr__(self) -> str:
        return "EXHAUSTED"


EXHAUSTED = _Exhausted()
"""Returned by ``StreamBuffer.chunk`` when the stream ended and chunk ``i`` will never exist."""


class StreamOverflow(Exception):
    """The producer outran the consumer past the buffer's hard bound."""


class StreamBuffer:
    """Holds the items of one stream that a future chunk can still need.

    Items arrive with ``push``; ``end`` marks the producer finished. The
    consumer asks for chunk ``i`` with ``chunk(i)`` (idempotent) and reports
    it done with ``consumed(i)``, after which items no later chunk needs are
    dropped. ``full`` says the producer should pause (backpressure); pushing
    past ``hard_limit`` raises StreamOverflow so the request fails clearly
    instead of growing memory.
    """

    def __init__(self, policy: ChunkPolicy, capacity: int = 4096, hard_limit: int | None = None):
        if capacity < policy.min_capacity():
            raise ValueError(
                f"stream capacity {capacity} is below what {policy.describe()} needs ({policy.min_capacity()})"
            )
        self.policy = policy
        self.capacity = capacity
        self.hard_limit = hard_limit if hard_limit is not None else 2 * capacity
        self._items: deque[Any] = deque()
        self._base = 0  # absolute index of self._items[0]
        self._n = 0
        self._ended = False
        self._next_unconsumed = 0

    @property
    def n_items(self) -> int:
        return self._n

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def held(self) -> int:
        """Items kept in memory now."""
        return len(self._items)

    @property
    def full(self) -> bool:
        return self.held >= self.capacity

    def push(self, item: Any) -> None:
        if self._ended:
            raise RuntimeError("push after end of stream")
        if self.held >= self.hard_limit:
            raise StreamOverflow(
                f"stream buffer holds {self.held} items (bound {self.hard_limit}); "
                f"the consumer ({self.policy.describe()}) is not keeping up"
            )
        self._items.append(item)
        self._n += 1

    def end(self) -> None:
        self._ended = True

    def span(self, i: int) -> Span | None:
        return self.policy.span(i, self._n, self._ended)

    def chunk(self, i: int) -> Chunk | _Exhausted | None:
        """Chunk ``i`` if it can be formed now; None if not yet; EXHAUSTED if never."""
        span = self.policy.span(i, self._n, self._ended)
        if span is None:
            if not self._ended:
                return None
            if self.policy.continue_after_end:
                return Chunk(Span(i, self._n, self._n, 0), ())
            return EXHAUSTED
        lo, hi = span.start - self._base, span.end - self._base
        if lo < 0:
            raise RuntimeError(f"chunk {i} needs item {span.start} but items before {self._base} were released")
        items = tuple(self._items[k] for k in range(lo, hi))
        return Chunk(span, items)

    def consumed(self, i: int) -> None:
        """The consumer is done with chunks up to ``i``; release what no later chunk needs."""
        self._next_unconsumed = max(self._next_unconsumed, i + 1)
        keep = min(self.policy.keep_from(self._next_unconsumed), self._n)
        while self._base < keep and self._items:
            self._items.popleft()
            self._base += 1
