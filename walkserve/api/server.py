"""serve(): run the app under uvicorn; SIGTERM drains (health 503, running requests finish) then stops."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import uvicorn

from walkserve.api.app import build_app
from walkserve.api.config import ServerConfig
from walkserve.api.realtime.socket import end_sessions
from walkserve.api.state import AppState
from walkserve.entrypoint.interface import EngineClient

log = logging.getLogger(__name__)
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACE_AFTER_DRAIN_S = 3  # uvicorn's own wait for connections once the drain is over (or timed out)


class DrainingServer(uvicorn.Server):
    """The first SIGTERM/SIGINT starts a drain instead of closing the sockets at once:
    /health answers 503 and new work 503 while in-flight requests finish (up to
    ``drain_timeout_s``) and realtime sessions finish their running response, get an
    ``error`` event and close 1001; then uvicorn shuts down as usual. A second signal
    forces the exit."""

    def __init__(
        self,
        config: uvicorn.Config,
        state: AppState,
        drain_timeout_s: float,
        on_started: Callable[[], None] | None = None,
    ):
        super().__init__(config)
        self.state = state
        self.drain_timeout_s = drain_timeout_s
        self.on_started = on_started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit and self.on_started is not None:
            self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig in DRAIN_SIGNALS and not self.state.drain.draining and self._loop is not None:
            self.state.drain.start()
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self.drain_and_exit())

    async def drain_and_exit(self) -> None:
        self.state.drain.start()
        log.info("draining: %d request(s) in flight and %d realtime session(s), waiting up to %.0fs",
                 self.state.drain.in_flight, len(self.state.realtime_sessions), self.drain_timeout_s)
        idle, _ = await asyncio.gather(self.state.drain.wait_idle(self.drain_timeout_s),
                                       end_sessions(self.state, self.drain_timeout_s))
        if not idle:
            log.warning("drain timeout: %d request(s) still in flight", self.state.drain.in_flight)
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        """Realtime sessions still open (a stop without a drain) get their close event and 1001 before uvicorn
        drops the connections (it would close them with 1012 and no event)."""
        await end_sessions(self.state, 0.0)
        await super().shutdown(sockets)


def uvicorn_config(app: Any, config: ServerConfig, grace_s: float = GRACE_AFTER_DRAIN_S) -> uvicorn.Config:
    """uvicorn's settings for ``app`` under ``config`` (its frame cap is the largest websocket route's ceiling;
    ``grace_s``: its own wait for connections once a drain is over)."""
    return uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                          timeout_graceful_shutdown=grace_s, access_log=False,
                          ws_max_size=config.ws_max_size)


async def serve_async(
    engine: EngineClient,
    config: ServerConfig | None = None,
    sockets: Sequence[socket.socket] | None = None,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Serve until a signal (or ``should_exit``); then drain and ``await engine.shutdown()``.

    ``sockets``: already bound listening sockets to serve on instead of
    ``config.host``/``config.port`` (bind early to fail fast on a busy port).
    ``on_started`` is called once the server accepts connections.
    """
    config = config or ServerConfig()
    try:
        app = build_app(engine, config)
        server = DrainingServer(uvicorn_config(app, config), app.state.walkserve, config.drain_timeout_s, on_started)
        await server.serve(list(sockets) if sockets else None)
    finally:
        await engine.shutdown()
        log.info("engine shut down; server stopped")


def serve(engine: EngineClient, config: ServerConfig | None = None) -> None:
    """Blocking: run the HTTP server for ``engine`` in this (main) thread."""
    asyncio.run(serve_async(engine, config))
