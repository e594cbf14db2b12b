"""API-key check: ``Authorization: Bearer <key>`` on every /v1 route, compared in constant time."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from walkserve.api.asgi_reply import send_error
from walkserve.api.errors import ApiError

PROTECTED_PREFIX = "/v1/"


def _bearer(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


class ApiKeyMiddleware:
    """401 unless the request carries the configured key. /health, /metrics and the schema stay open."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIX):
            given = _bearer(scope).encode()
            if not hmac.compare_digest(given, self._key):
                message = "missing API key" if not given else "invalid API key"
                error = ApiError(401, f"{message}; send 'Authorization: Bearer <key>'", None, "invalid_api_key")
                error.headers["WWW-Authenticate"] = "Bearer"
                await send_error(send, error)
                return
        await self.app(scope, receive, send)
