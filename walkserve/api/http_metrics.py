"""Counts every HTTP response by route template and status (unknown paths share one label)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from walkserve.api.metrics import ApiMetrics


class HttpMetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ApiMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            route = scope.get("route")
            self.metrics.count_response(getattr(route, "path", "unmatched"), status)
