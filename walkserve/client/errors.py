"""APIError: an error envelope from the server (or inside a stream)."""

from __future__ import annotations

import json
from typing import Any


class APIError(Exception):
    """``status`` is the HTTP status (200 for an error event inside a stream)."""

    def __init__(self, status: int, message: str, type: str | None = None, param: str | None = None,
                 code: str | None = None, retry_after: float | None = None):
        super().__init__(f"{status} {type or 'error'}: {message}" + (f" (param: {param})" if param else ""))
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    @classmethod
    def from_envelope(cls, status: int, envelope: Any, retry_after: float | None = None) -> APIError:
        error = envelope.get("error") if isinstance(envelope, dict) else None
        if not isinstance(error, dict):
            return cls(status, str(envelope)[:500], retry_after=retry_after)
        return cls(status, str(error.get("message", "")), error.get("type"), error.get("param"), error.get("code"), retry_after)

    @classmethod
    def from_response(cls, status: int, body: bytes, headers: Any) -> APIError:
        retry = headers.get("retry-after")
        try:
            envelope = json.loads(body)
        except ValueError:
            envelope = body.decode("utf-8", "replace")
        return cls.from_envelope(status, envelope, float(retry) if retry else None)
