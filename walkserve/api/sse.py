"""Server-sent events and NDJSON framing."""

from __future__ import annotations

import json
from typing import Any

from walkserve.api.errors import ApiError

SSE_DONE = b"data: [DONE]\n\n"


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {dumps(obj)}\n\n".encode()


def ndjson(obj: Any) -> bytes:
    return (dumps(obj) + "\n").encode()


def sse_error_then_done(error: ApiError) -> bytes:
    """An OpenAI stream's error: one event with the envelope, then [DONE]."""
    return sse(error.envelope()) + SSE_DONE


def sse_error(error: ApiError) -> bytes:
    return sse(error.envelope())


def ndjson_error(error: ApiError) -> bytes:
    return ndjson({"type": "error", **error.envelope()})
