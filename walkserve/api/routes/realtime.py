"""GET /v1/realtime?model=ID: the OpenAI Realtime API over a WebSocket. See ``walkserve/api/realtime/``."""

from __future__ import annotations

from starlette.websockets import WebSocket

from walkserve.api.realtime.response import ROUTE
from walkserve.api.realtime.socket import serve_realtime
from walkserve.api.routes.common import router

routes = router()


@routes.websocket(ROUTE)
async def realtime(websocket: WebSocket) -> None:
    await serve_realtime(websocket, websocket.app.state.walkserve)
