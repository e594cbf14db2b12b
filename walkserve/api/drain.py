"""Drain: count in-flight work requests, refuse new ones once draining, wait for the rest."""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from walkserve.api.asgi_reply import send_error
from walkserve.api.errors import unavailable

WORK_PREFIX = "/v1/"


class DrainState:
    """Shared by the middleware, /health and serve()'s SIGTERM handler."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0

    def start(self) -> None:
        self.draining = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """True when no work request is in flight any more, False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.in_flight == 0


class DrainMiddleware:
    """POST /v1/* is work: counted while it runs, answered 503 once the server drains."""

    def __init__(self, app: ASGIApp, state: DrainState):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_work = scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith(WORK_PREFIX)
        if not is_work:
            await self.app(scope, receive, send)
            return
        if self.state.draining:
            await send_error(send, unavailable("the server is shutting down", "draining"))
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1
