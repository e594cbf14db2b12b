"""RequestTraceMiddleware: each /v1 request gets an ``X-Request-Id`` (its timeline's id) and, with tracing
on, a server span: the client's W3C ``traceparent`` is its parent, and the response's ``traceparent``
names it. The scope is set in ``core.trace.CURRENT`` while the request runs, so the requests its
handler submits join its trace, and log lines name it. Nothing is added when the engine keeps no
timeline (``EngineClient.timeline`` None).
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from walkserve.core.ids import new_request_id
from walkserve.core.trace import CURRENT, TraceScope, server_context
from walkserve.entrypoint.timeline import TimelineStore

PREFIX = "/v1/"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


class RequestTraceMiddleware:
    def __init__(self, app: ASGIApp, store: TimelineStore):
        self.app, self.store = app, store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        store = self.store
        context = server_context(_header(scope, b"traceparent")) if store.tracing else None
        key = new_request_id("http")
        added = [(b"x-request-id", key.encode())]
        if context is not None:
            added.append((b"traceparent", context.traceparent.encode()))
        status, started = [0], time.time_ns()

        async def send_with_ids(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        token = CURRENT.set(TraceScope(key, context))
        try:
            await self.app(scope, receive, send_with_ids)
        finally:
            CURRENT.reset(token)
            attrs = {"http.request.method": scope["method"], "url.path": scope["path"]}
            store.http_done(key, f"{scope['method']} {scope['path']}", status[0], attrs, started)
