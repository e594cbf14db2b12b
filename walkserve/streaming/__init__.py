"""Chunk policies and per-request stream buffers for streaming edges (torch-free)."""

from walkserve.streaming.buffer import EXHAUSTED, StreamBuffer, StreamOverflow
from walkserve.streaming.policy import (
    Chunk,
    ChunkPolicy,
    FixedChunk,
    LeftContext,
    SlidingWindow,
    Span,
)

__all__ = [
    "EXHAUSTED",
    "Chunk",
    "ChunkPolicy",
    "FixedChunk",
    "LeftContext",
    "SlidingWindow",
    "Span",
    "StreamBuffer",
    "StreamOverflow",
]
