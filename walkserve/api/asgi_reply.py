"""Answer an error envelope straight from ASGI middleware (before any route runs)."""

from __future__ import annotations

import json

from starlette.types import Send

from walkserve.api.errors import ApiError


async def send_error(send: Send, error: ApiError) -> None:
    body = json.dumps(error.envelope()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
