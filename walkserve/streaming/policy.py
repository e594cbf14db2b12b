"""Chunk policies: when a streaming consumer has a valid input, and what it holds.

A policy is pure arithmetic on item counts. For chunk ``i`` it says which
span of the stream ``[start, end)`` the chunk covers, given how many items
exist so far and whether the producer has ended. The first ``n_context``
items of a span were already delivered by earlier chunks (overlap or left
context); the rest are new. Over a whole stream, the new parts of all chunks
concatenated equal the stream exactly (unless the policy declares ``drop``
for its tail, or a window stride larger than the window skips items).

    FixedChunk(4):          |0 1 2 3|4 5 6 7|8 9|            (tail flushed)
    SlidingWindow(4, 2):    |0 1 2 3|
                                |2 3 4 5|
                                    |4 5 6 7|  + final [4, n) on end
    LeftContext(3, 2):      |0 1 2|
                              (1 2)|3 4 5|
                                    (4 5)|6 7|               (context in parens)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

END_RULES = ("flush", "pad", "drop")


@dataclass(frozen=True, slots=True)
class Span:
    """Chunk ``index`` covers items ``[start, end)``; the first ``n_context`` were delivered before.

    ``final`` marks a chunk that exists only because the stream ended (a
    flushed tail); it never depends on when the end became known.
    """

    index: int
    start: int
    end: int
    n_context: int
    final: bool = False
    n_pad: int = 0  # items the consumer appends to reach the policy's chunk size (end="pad")

    @property
    def n_items(self) -> int:
        return self.end - self.start

    @property
    def n_new(self) -> int:
        return self.n_items - self.n_context


@dataclass(frozen=True, slots=True)
class Chunk:
    """A span with its items, as a consumer receives it. ``items`` may be empty."""

    span: Span
    items: tuple[Any, ...]

    @property
    def index(self) -> int:
        return self.span.index

    @property
    def empty(self) -> bool:
        return not self.items

    @property
    def new_items(self) -> tuple[Any, ...]:
        return self.items[self.span.n_context :]


class ChunkPolicy(ABC):
    """Decides the span of each chunk of a stream from item counts alone.

    ``span(i, n, ended)`` is called with ``i`` increasing from 0; it returns
    the span of chunk ``i`` when ``n`` items exist (and the stream has ended,
    if ``ended``), or None when chunk ``i`` cannot be formed yet (or ever,
    once ended). It must be monotone: once a span is returned for ``(i, n)``
    the same span is returned for any larger ``n``.
    """

    end: str = "flush"
    continue_after_end: bool = False

    @abstractmethod
    def span(self, i: int, n: int, ended: bool) -> Span | None: ...

    @abstractmethod
    def keep_from(self, next_index: int) -> int:
        """The first item index any chunk ``>= next_index`` can still need."""

    @abstractmethod
    def min_capacity(self) -> int:
        """The fewest buffered items the policy needs to form a chunk."""

    @abstractmethod
    def describe(self) -> str: ...

    def _check_end(self) -> None:
        if self.end not in END_RULES:
            raise ValueError(f"{type(self).__name__}: end must be one of {END_RULES}, got {self.end!r}")


@dataclass(frozen=True)
class FixedChunk(ChunkPolicy):
    """Fire every ``size`` new items, no overlap.

    On end, a partial tail is flushed as a shorter chunk (``end="flush"``),
    flushed with ``n_pad`` telling the consumer how much to pad
    (``end="pad"``), or dropped (``end="drop"``). With
    ``continue_after_end`` the consumer keeps receiving empty chunks once the
    stream is exhausted (a loop consumer that runs past its producer).
    """

    size: int
    end: str = "flush"
    continue_after_end: bool = False

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"FixedChunk size must be >= 1, got {self.size}")
        self._check_end()

    def span(self, i: int, n: int, ended: bool) -> Span | None:
        start, stop = i * self.size, (i + 1) * self.size
        if n >= stop:
            return Span(i, start, stop, 0)
        if ended and n > start and self.end != "drop":
            pad = stop - n if self.end == "pad" else 0
            return Span(i, start, n, 0, final=True, n_pad=pad)
        return None

    def keep_from(self, next_index: int) -> int:
        return next_index * self.size

    def min_capacity(self) -> int:
        return self.size

    def describe(self) -> str:
        extra = ", continue after end" if self.continue_after_end else ""
        return f"FixedChunk({self.size}{extra}, end={self.end})"


@dataclass(frozen=True)
class SlidingWindow(ChunkPolicy):
    """First fire at ``window`` items, then every ``stride`` items; each chunk is the last ``window`` items.

    Regular windows for ``n`` items: 0 if n < window else 1 + (n - window) // stride.
    With ``end="flush"`` one final chunk follows on end of stream: the span from
    the start of the last regular window to the end (``n_context = window``,
    possibly zero new items), or the whole stream if no window formed. The
    consumer uses it to emit its tail. ``end="drop"`` ends with the last regular window.
    """

    window: int
    stride: int
    end: str = "flush"

    def __post_init__(self) -> None:
        if self.window < 1 or self.stride < 1:
            raise ValueError(f"SlidingWindow needs window >= 1 and stride >= 1, got ({self.window}, {self.stride})")
        if self.end == "pad":
            raise ValueError("SlidingWindow supports end='flush' or 'drop'")
        self._check_end()

    def n_windows(self, n: int) -> int:
        return 0 if n < self.window else 1 + (n - self.window) // self.stride

    def span(self, i: int, n: int, ended: bool) -> Span | None:
        start = i * self.stride
        if start + self.window <= n:
            context = max(0, self.window - self.stride) if i > 0 else 0
            return Span(i, start, start + self.window, context)
        if not ended or self.end == "drop" or i != self.n_windows(n) or n == 0:
            return None
        if i == 0:
            return Span(0, 0, n, 0, final=True)
        last_start = (i - 1) * self.stride
        return Span(i, last_start, n, min(self.window, n - last_start), final=True)

    def keep_from(self, next_index: int) -> int:
        return max(0, (next_index - 1) * self.stride)

    def min_capacity(self) -> int:
        return self.window + self.stride

    def describe(self) -> str:
        return f"SlidingWindow({self.window}, {self.stride}, end={self.end})"


@dataclass(frozen=True)
class LeftContext(ChunkPolicy):
    """Every ``size`` new items, prefixed by up to ``context`` retained old items.

    The first chunk has no context. On end, a partial tail is flushed (with its
    context) or dropped.
    """

    size: int
    context: int
    end: str = "flush"

    def __post_init__(self) -> None:
        if self.size < 1 or self.context < 0:
            raise ValueError(f"LeftContext needs size >= 1 and context >= 0, got ({self.size}, {self.context})")
        if self.end == "pad":
            raise ValueError("LeftContext supports end='flush' or 'drop'")
        self._check_end()

    def span(self, i: int, n: int, ended: bool) -> Span | None:
        new_start, stop = i * self.size, (i + 1) * self.size
        start = max(0, new_start - self.context)
        if n >= stop:
            return Span(i, start, stop, new_start - start)
        if ended and n > new_start and self.end == "flush":
            return Span(i, start, n, new_start - start, final=True)
        return None

    def keep_from(self, next_index: int) -> int:
        return max(0, next_index * self.size - self.context)

    def min_capacity(self) -> int:
        return self.size + self.context

    def describe(self) -> str:
        return f"LeftContext({self.size}, {self.context}, end={self.end})"
