"""What a compiled walk plan is made of: scopes, routes, slot sources and resolved streams."""

from __future__ import annotations

from dataclasses import dataclass

from walkserve.graph.compose import Loop
from walkserve.graph.edge import StreamingGraphEdge
from walkserve.streaming.policy import ChunkPolicy

INPUT = "input"
OUTPUT = "output"


@dataclass(frozen=True)
class Scope:
    """A loop or a per-chunk stream scope. ``chain`` ends with this scope's id."""

    id: str
    kind: str  # "loop" | "dynamic" | "stream"
    chain: tuple[str, ...]
    loop: Loop | None = None
    stream: int | None = None  # index of the stream that drives a "stream" scope

    @property
    def parent(self) -> str | None:
        return self.chain[-2] if len(self.chain) > 1 else None


# ---- routes: where one output value goes ---------------------------------------------------


@dataclass(frozen=True)
class ToNode:
    node: str
    slot: str
    exits: tuple[str, ...] = ()  # scopes left, innermost first


@dataclass(frozen=True)
class ToCarry:
    node: str
    slot: str
    scope: str


@dataclass(frozen=True)
class ToStream:
    stream: int


@dataclass(frozen=True)
class ToClient:
    modality: str


@dataclass(frozen=True)
class ToOutput:
    name: str
    exits: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToDrop:
    pass


Route = ToNode | ToCarry | ToStream | ToClient | ToOutput | ToDrop


# ---- slot sources: what fills one input slot ------------------------------------------------


@dataclass(frozen=True)
class FromEdge:
    node: str  # producing node, or "input" for a walk input
    output: str
    exits: tuple[str, ...] = ()


@dataclass(frozen=True)
class FromCarry:
    scope: str
    node: str
    output: str
    initial: FromEdge


@dataclass(frozen=True)
class FromStream:
    stream: int


SlotSource = FromEdge | FromCarry | FromStream


@dataclass(frozen=True)
class StreamInfo:
    """One streaming edge, resolved.

    ``mode`` is "loop" when the consumer sits in a loop of its own (chunk i
    fills its iteration i; the loop ends when the stream is exhausted) and
    "chunk" when the consumer fires once per chunk in its own stream scope.
    """

    index: int
    edge: StreamingGraphEdge
    producer: str
    output: str
    consumer: str
    slot: str
    policy: ChunkPolicy
    capacity: int
    producer_scope: str
    consumer_scope: str
    mode: str
