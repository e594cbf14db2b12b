"""The ``/v1/realtime`` WebSocket: handshake checks, the receive loop with its limits, and teardown.

    connect ?model=ID  (the key when the server has one, Bearer or a browser's subprotocol: else refused, 403;
                       subprotocol ``realtime`` chosen when offered)
       over the session cap, draining, engine down, unknown model, no chat:  error event, then close
    receive loop     text frame -> session.handle (an error event for anything wrong; the session goes on)
                     event over realtime_max_event_bytes -> error event (not a close); uvicorn reads frames up to
                     ServerConfig.ws_max_size, and a frame over realtime_frame_ceiling closes the socket (1009)
                     no client event for realtime_idle_timeout_s (while no response runs) -> error event, close
                     realtime_max_session_s reached -> error event, close
                     server shutdown (``end_sessions``) -> error event server_shutting_down, close 1001
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

POLICY_VIOLATION, TRY_AGAIN_LATER, NORMAL, GOING_AWAY, MESSAGE_TOO_BIG = 1008, 1013, 1000, 1001, 1009
CLOSE_WAIT_S = 5.0  # how long a shutdown waits for its sessions' sockets to close
SHUTTING_DOWN = ApiError(503, "the server is shutting down; this session is closed", None, "server_shutting_down")


SUBPROTOCOL = "realtime"
KEY_SUBPROTOCOL = "openai-insecure-api-key."  # a browser cannot set headers: it offers the key as a subprotocol


def key_ok(websocket: WebSocket, api_key: str | None) -> bool:
    """The server's key, as ``Authorization: Bearer KEY`` or, from a browser, as the offered subprotocol
    ``openai-insecure-api-key.KEY`` (the OpenAI Realtime API's convention)."""
    if api_key is None:
        return True
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else ""
    if not given:
        offered = websocket.scope.get("subprotocols") or ()
        given = next((p.removeprefix(KEY_SUBPROTOCOL) for p in offered if p.startswith(KEY_SUBPROTOCOL)), "")
    return hmac.compare_digest(given.encode(), api_key.encode())


def chosen_subprotocol(websocket: WebSocket) -> str | None:
    """``realtime`` when the client offers it (browsers fail a handshake that offered subprotocols and got none
    back); else none, as for a client that offers none."""
    return SUBPROTOCOL if SUBPROTOCOL in (websocket.scope.get("subprotocols") or ()) else None


def admission_error(state: AppState, model: str | None) -> ApiError | None:
    """Why this session cannot start (None: it can)."""
    try:
        state.check_ready()
        state.check_model(model)
        state.require("chat", "realtime sessions (chat)")
    except ApiError as e:
        return e
    if len(state.realtime_sessions) >= state.config.realtime_max_sessions:
        return ApiError(429, f"this server holds at most {state.config.realtime_max_sessions} realtime sessions; "
                        "retry later", None, "session_limit_reached")
    return None


async def serve_realtime(websocket: WebSocket, state: AppState) -> None:
    if not key_ok(websocket, state.config.api_key):
        await websocket.close(code=POLICY_VIOLATION)
        return
    await websocket.accept(subprotocol=chosen_subprotocol(websocket))
    model = websocket.query_params.get("model")
    refused = admission_error(state, model)
    if refused is not None:
        await websocket.send_text(json.dumps(error_event(refused)))
        await websocket.close(code=TRY_AGAIN_LATER if refused.status in (429, 503) else POLICY_VIOLATION)
        return
    session = RealtimeSession(state, model or state.card.id)
    writer = asyncio.ensure_future(_write(websocket, session))
    state.realtime_sessions.add(session)
    code = NORMAL
    try:
        await session.open()
        reason, code = await _receive(websocket, session, state)
        await session.close()  # the running response ends (response.done) before the error that says why
        if reason is not None:
            await session.send(error_event(reason))
    except WebSocketDisconnect:
        pass
    finally:
        state.realtime_sessions.discard(session)
        await session.close()
        await _finish(websocket, session, writer, code)


async def end_sessions(state: AppState, grace_s: float) -> None:
    """Server shutdown: each open session may finish its running response for up to ``grace_s``, then gets an
    ``error`` event (``server_shutting_down``) and close 1001; returns once their sockets closed (or after
    ``CLOSE_WAIT_S`` more)."""
    sessions = list(state.realtime_sessions)
    await asyncio.gather(*(s.end(SHUTTING_DOWN, grace_s) for s in sessions))
    deadline = time.monotonic() + CLOSE_WAIT_S
    while any(s in state.realtime_sessions for s in sessions) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def _receive(websocket: WebSocket, session: RealtimeSession, state: AppState) -> tuple[ApiError | None, int]:
    """Client events until the client leaves (no error), or a limit or the server's shutdown ends the session (the
    error to send); and the close code."""
    config = state.config
    deadline = time.monotonic() + config.realtime_max_session_s
    last = time.monotonic()
    ended = asyncio.ensure_future(session.ended.wait())
    receive: asyncio.Future | None = None
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                return ApiError(400, f"the session reached its limit of {config.realtime_max_session_s:g} s", None,
                                "session_expired"), NORMAL
            idle_at = last + config.realtime_idle_timeout_s
            if now >= idle_at and not session.responding:
                return ApiError(400, f"no client event for {config.realtime_idle_timeout_s:g} s; the session is "
                                "closed", None, "session_idle_timeout"), NORMAL
            receive = receive or asyncio.ensure_future(websocket.receive())
            await asyncio.wait({receive, ended}, timeout=max(0.05, min(deadline, idle_at) - now),
                               return_when=asyncio.FIRST_COMPLETED)
            if ended.done():
                return session.end_reason, GOING_AWAY
            if not receive.done():
                continue
            message, receive = receive.result(), None
            if message["type"] == "websocket.disconnect":
                return None, NORMAL
            if _size(message) > config.realtime_frame_ceiling:
                return None, MESSAGE_TOO_BIG
            last = time.monotonic()
            await _dispatch(session, message, config.realtime_max_event_bytes)
    finally:
        for task in (ended, receive):
            if task is not None:
                task.cancel()


def _size(message: dict) -> int:
    return len(message.get("text") or message.get("bytes") or "")


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


async def _finish(websocket: WebSocket, session: RealtimeSession, writer: asyncio.Task, code: int) -> None:
    """Flush what is queued (a client still there gets its last events), then close with ``code``."""
    if session.outbox.full():
        writer.cancel()
    else:
        session.outbox.put_nowait(None)
    try:
        await asyncio.wait_for(writer, 5)
    except (TimeoutError, asyncio.CancelledError):
        writer.cancel()
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await websocket.close(code=code)
