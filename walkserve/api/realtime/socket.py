"""The ``/v1/realtime`` WebSocket: handshake checks, the receive loop with its limits, and teardown.

    connect ?model=ID  (Bearer key when the server has one: else refused, 403)
       over the session cap, draining, engine down, unknown model, no chat:  error event, then close
    receive loop     text frame -> session.handle (an error event for anything wrong; the session goes on)
                     frame over realtime_max_event_bytes -> error event (not a close)
                     no client event for realtime_idle_timeout_s (while no response runs) -> error event, close
                     realtime_max_session_s reached -> error event, close
    writer           one task sends the session's queued events in order
    teardown         (client gone, or closed) the running response is cancelled: its request is aborted
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time

from starlette.websockets import WebSocket, WebSocketDisconnect

from walkserve.api.errors import ApiError
from walkserve.api.realtime.events import error_event
from walkserve.api.realtime.session import RealtimeSession
from walkserve.api.state import AppState

POLICY_VIOLATION, TRY_AGAIN_LATER, NORMAL = 1008, 1013, 1000


def bearer_ok(websocket: WebSocket, api_key: str | None) -> bool:
    if api_key is None:
        return True
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else ""
    return hmac.compare_digest(given.encode(), api_key.encode())


def admission_error(state: AppState, model: str | None) -> ApiError | None:
    """Why this session cannot start (None: it can)."""
    try:
        state.check_ready()
        state.check_model(model)
        state.require("chat", "realtime sessions (chat)")
    except ApiError as e:
        return e
    if state.realtime_sessions >= state.config.realtime_max_sessions:
        return ApiError(429, f"this server holds at most {state.config.realtime_max_sessions} realtime sessions; "
                        "retry later", None, "session_limit_reached")
    return None


async def serve_realtime(websocket: WebSocket, state: AppState) -> None:
    if not bearer_ok(websocket, state.config.api_key):
        await websocket.close(code=POLICY_VIOLATION)
        return
    await websocket.accept()
    model = websocket.query_params.get("model")
    refused = admission_error(state, model)
    if refused is not None:
        await websocket.send_text(json.dumps(error_event(refused)))
        await websocket.close(code=TRY_AGAIN_LATER if refused.status in (429, 503) else POLICY_VIOLATION)
        return
    session = RealtimeSession(state, model or state.card.id)
    writer = asyncio.ensure_future(_write(websocket, session))
    state.realtime_sessions += 1
    try:
        await session.open()
        reason = await _receive(websocket, session, state)
        if reason is not None:
            await session.send(error_event(reason))
    except WebSocketDisconnect:
        pass
    finally:
        state.realtime_sessions -= 1
        await session.close()
        await _finish(websocket, session, writer)


async def _receive(websocket: WebSocket, session: RealtimeSession, state: AppState) -> ApiError | None:
    """Client events until the client leaves (None) or a limit ends the session (the error to send)."""
    config = state.config
    deadline = time.monotonic() + config.realtime_max_session_s
    last = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= deadline:
            return ApiError(400, f"the session reached its limit of {config.realtime_max_session_s:g} s", None,
                            "session_expired")
        idle_at = last + config.realtime_idle_timeout_s
        if now >= idle_at and not session.responding:
            return ApiError(400, f"no client event for {config.realtime_idle_timeout_s:g} s; the session is closed",
                            None, "session_idle_timeout")
        try:
            message = await asyncio.wait_for(websocket.receive(), max(0.05, min(deadline, idle_at) - now))
        except TimeoutError:
            continue
        if message["type"] == "websocket.disconnect":
            return None
        last = time.monotonic()
        await _dispatch(session, message, config.realtime_max_event_bytes)


async def _dispatch(session: RealtimeSession, message: dict, limit: int) -> None:
    text = message.get("text")
    if text is None and message.get("bytes") is not None:
        try:
            text = message["bytes"].decode()
        except UnicodeDecodeError:
            text = ""
    if len(text or "") > limit:
        error = ApiError(400, f"an event of {len(text)} bytes is over this server's limit of {limit} bytes", None,
                         "event_too_large")
        await session.send(error_event(error))
        return
    await session.handle(text or "")


async def _write(websocket: WebSocket, session: RealtimeSession) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        while True:
            message = await session.outbox.get()
            if message is None:
                return
            await websocket.send_text(json.dumps(message))


async def _finish(websocket: WebSocket, session: RealtimeSession, writer: asyncio.Task) -> None:
    """Flush what is queued (a client still there gets its last events), then close."""
    if session.outbox.full():
        writer.cancel()
    else:
        session.outbox.put_nowait(None)
    try:
        await asyncio.wait_for(writer, 5)
    except (TimeoutError, asyncio.CancelledError):
        writer.cancel()
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await websocket.close(code=NORMAL)
