"""Server events of the Realtime API as plain dicts, named and shaped as the ``openai`` package's
``types/realtime`` parse them (GA names: ``conversation.item.added``, ``response.output_audio.delta`` ...)."""

from __future__ import annotations

import secrets
from typing import Any

from walkserve.api.errors import ApiError


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": new_id("event"), **fields}


def error_event(error: ApiError, client_event_id: str | None = None) -> dict[str, Any]:
    """The ``error`` event: the ApiError's type, code, message and param, and the client event it answers."""
    body = {"type": error.type, "code": error.code, "message": error.message, "param": error.param,
            "event_id": client_event_id}
    return event("error", error=body)


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)
