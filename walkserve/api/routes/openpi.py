"""openpi's websocket policy protocol: /v1/openpi, and / (where openpi's own server listens, so a robot's
``WebsocketClientPolicy(host, port)`` connects unchanged). See ``walkserve/api/openpi/policy_socket.py``."""

from __future__ import annotations

from starlette.websockets import WebSocket

from walkserve.api.openpi.policy_socket import ROUTE, serve_policy
from walkserve.api.routes.common import router

routes = router()


@routes.websocket(ROUTE)
async def openpi_policy(websocket: WebSocket) -> None:
    await serve_policy(websocket, websocket.app.state.walkserve)


@routes.websocket("/")
async def openpi_policy_root(websocket: WebSocket) -> None:
    await serve_policy(websocket, websocket.app.state.walkserve)
