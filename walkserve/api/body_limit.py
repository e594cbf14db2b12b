"""Body size cap: 413 from Content-Length before reading, and while a chunked body streams in."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from walkserve.api.asgi_reply import send_error
from walkserve.api.errors import ApiError


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes", None, "body_too_large")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None


class BodyLimitMiddleware:
    """Rejects bodies over ``limit`` bytes; a malformed Content-Length is a 400."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared < 0:
            await send_error(send, ApiError(400, "malformed Content-Length header", None, "invalid_header"))
            return
        if declared is not None and declared > self.limit:
            await send_error(send, too_large(self.limit))
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise too_large(self.limit)
            return message

        await self.app(scope, counted_receive, send)
