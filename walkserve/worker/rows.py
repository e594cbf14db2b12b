"""One request's row of a batched worker-to-worker message, as the executor applies it.

A Values, StreamItems, StreamEnds, LoopEvents or Flows message carries one
row per request; each row is applied to its request's walk on this rank. A
row for a walk that has not started here yet, or for a loop instance that has
not joined yet, waits as one of these until it can be applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Path = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ValueRow:
    """A node output's value, at its producer's path or the path of the level it lands in."""

    node: str
    output: str
    path: Path
    value: Any


@dataclass(frozen=True, slots=True)
class ItemRow:
    stream: int
    prefix: Path
    index: int
    value: Any


@dataclass(frozen=True, slots=True)
class EndRow:
    stream: int
    prefix: Path
    n_items: int


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """Iteration ``k`` of the level's instance ``outer`` continues (``end`` < 0) or it ended with ``end``."""

    scope: str
    outer: Path
    k: int
    end: int


@dataclass(frozen=True, slots=True)
class FlowRow:
    stream: int
    prefix: Path
    pause: bool


Row = ValueRow | ItemRow | EndRow | DecisionRow | FlowRow
