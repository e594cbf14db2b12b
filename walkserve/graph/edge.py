"""Edges: ``producer.output -> consumer.input``, the client, a walk output, or DROP."""

from __future__ import annotations

from dataclasses import dataclass

from walkserve.core.errors import GraphError
from walkserve.streaming.policy import ChunkPolicy

MODALITIES = ("text", "audio", "image", "video", "action", "latent", "logprobs")


@dataclass(frozen=True)
class Client:
    """The request's client, receiving one output modality."""

    modality: str

    def __post_init__(self) -> None:
        if self.modality not in MODALITIES:
            raise GraphError(f"unknown client modality {self.modality!r} (known: {', '.join(MODALITIES)})")

    def __str__(self) -> str:
        return f"client:{self.modality}"


@dataclass(frozen=True)
class Drop:
    """Discard an output on purpose."""

    def __str__(self) -> str:
        return "drop"


DROP = Drop()

Endpoint = str | Client | Drop


@dataclass(frozen=True)
class GraphEdge:
    """``src -> dst``.

    ``src`` is ``"node.output"`` or ``"input.<walk input>"``. ``dst`` is
    ``"node.input"``, ``"output.<walk output>"``, ``Client(modality)`` or ``DROP``.
    """

    src: str
    dst: Endpoint

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst}"


@dataclass(frozen=True)
class StreamingGraphEdge(GraphEdge):
    """An edge whose consumer fires per chunk.

    The producer, inside a loop, emits one item per iteration; items are
    buffered per request at the consumer, and ``policy`` decides when a chunk
    exists and what it holds. ``capacity`` bounds the buffered items: past it
    the producer is paused; past twice it the request fails.
    """

    policy: ChunkPolicy | None = None
    capacity: int = 4096

    def __str__(self) -> str:
        policy = self.policy.describe() if self.policy else "no policy"
        return f"{self.src} ~> {self.dst} [{policy}]"


def split_endpoint(endpoint: str, edge: GraphEdge, walk: str) -> tuple[str, str]:
    """``"a.b" -> ("a", "b")`` with an error that names the edge and the walk."""
    parts = endpoint.split(".") if isinstance(endpoint, str) else []
    if len(parts) != 2 or not all(parts):
        raise GraphError(f"walk {walk!r}: edge {edge}: endpoint {endpoint!r} is not of the form 'node.slot'")
    return parts[0], parts[1]
