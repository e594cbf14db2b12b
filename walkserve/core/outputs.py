"""What a request yields to its caller."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from walkserve.core.finish import FinishReason
from walkserve.core.ids import RequestId
from walkserve.core.request import Value


class OutputEvent(msgspec.Struct, frozen=True):
    """One piece of output for the client.

    ``modality`` is the client edge's modality (text, audio, image, video,
    action, latent, logprobs). ``iteration`` is the iteration path of the producing node
    (loop indices, outermost first; the chunk index for a stream consumer), so
    outputs of one modality can be put in order. ``data`` is the tensor as an
    ArrayData (token ids for text, float PCM for audio, uint8 HWC for images).
    Immutable; a msgspec Struct, which a busy frontend makes ten times faster
    than a frozen dataclass.
    """

    request_id: RequestId
    modality: str
    walk: str
    node: str
    iteration: tuple[int, ...]
    data: Value
    index: int = 0  # per-request sequence number of this (modality, output), from 0
    output: str = ""  # the producing node's output name (``logprobs`` events carry three)


@dataclass(frozen=True)
class RequestFinished:
    """The last event of a request."""

    request_id: RequestId
    reason: FinishReason
    error: str | None = None
    usage: dict = field(default_factory=dict)  # counters: prompt_tokens, completion_tokens, steps ...
    timings: dict = field(default_factory=dict)  # seconds: queue, first_output, total ...
