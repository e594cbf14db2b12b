"""Why a request ended."""

from __future__ import annotations

from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"  # a stop rule fired (EOS, end of speech, a stop string)
    LENGTH = "length"  # max_tokens / max_iterations reached
    ABORT = "abort"  # the client went away or cancelled
    ERROR = "error"  # a component raised, a worker died, or the request was invalid inside
