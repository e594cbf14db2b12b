"""Test helpers: a live uvicorn server on a free loopback port, an in-process ASGI client, envelope checks."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx

from walkserve.api import ServerConfig, build_app
from walkserve.api.server import DrainingServer, uvicorn_config
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig


@contextlib.contextmanager
def live_server(engine: FakeEngine, **config) -> Iterator[str]:
    """Serve ``engine`` with uvicorn in a background thread; yields the base URL."""
    with serving(engine, **config) as (url, _):
        yield url


@contextlib.contextmanager
def serving(engine: FakeEngine, **config) -> Iterator[tuple[str, DrainingServer]]:
    """``live_server`` with the server itself (``walkserve serve``'s: its uvicorn settings and drain)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server_config = ServerConfig(port=port, **{"log_level": "warning", **config})
    app = build_app(engine, server_config)
    server = DrainingServer(uvicorn_config(app, server_config, grace_s=2), app.state.walkserve,
                            server_config.drain_timeout_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def asgi_client(engine: FakeEngine | None = None, **config) -> httpx.AsyncClient:
    """An httpx client calling the app in-process (no sockets)."""
    engine = engine or FakeEngine(FakeEngineConfig(audio=True, images=True, token_delay_s=0.0))
    app = build_app(engine, ServerConfig(**config))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def assert_envelope(response: httpx.Response, status: int, param: str | None = "any", code: str | None = None) -> dict:
    """The response is the one error envelope, with no trace of internals in its message."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) >= {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    for leak in ("Traceback", "File \"", "/work/", "site-packages", " object at 0x"):
        assert leak not in error["message"], error["message"]
    if param != "any":
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error
