"""openpi's websocket policy protocol on this server, so ``openpi_client.WebsocketClientPolicy`` works unchanged.

    client                                   server (/v1/openpi, and / as openpi's own server listens)
    connect  ─────────────────────────────▶  (API key: "Authorization: Api-Key K" or "Bearer K"; else 403)
             ◀─────────────────────────────  binary: metadata (msgpack-numpy dict: the policy's cameras, state and
                                                     action sizes, horizon)
    infer    ── binary: observation dict ─▶  the model's processor maps and checks it (task "act"), the request runs
                                             through the same AsyncEngine path as POST /v1/generate
             ◀─ binary: {"actions": [H, A] float32, "server_timing": {"infer_ms": ...}}
             ◀─ text: {"error": {message, type, param, code}}   for a bad observation (param names its key), a text
                                                                 frame, a frame over max_ws_message_bytes, a full
                                                                 server, or a failed request; the connection stays open

Frames are decoded with ``codec`` (no pickle). One connection runs one
observation at a time, as openpi's client sends them; many connections run
concurrently and batch in the runtime like any other requests.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from walkserve.api.errors import ApiError, bad_request, to_api_error
from walkserve.api.openpi.codec import FrameError, decode, encode
from walkserve.api.state import AppState
from walkserve.core.array import ArrayData
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import RequestFinished
from walkserve.core.sampling import SamplingParams

log = logging.getLogger(__name__)
ROUTE = "/v1/openpi"
TASK = "act"
POLICY_VIOLATION = 1008  # websocket close code: a refused handshake (the client sees HTTP 403)
MESSAGE_TOO_BIG = 1009  # a frame over the route's ceiling


def key_ok(websocket: WebSocket, api_key: str | None) -> bool:
    """No key configured, or the handshake carries it as openpi sends it (``Api-Key K``) or as ``Bearer K``."""
    if api_key is None:
        return True
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    given = token.strip() if scheme.lower() in ("api-key", "bearer") else ""
    return hmac.compare_digest(given.encode(), api_key.encode())


async def serve_policy(websocket: WebSocket, state: AppState) -> None:
    """One client's session: metadata first, then an answer (or an error frame) per observation."""
    if not key_ok(websocket, state.config.api_key) or TASK not in state.card.capabilities:
        await websocket.close(code=POLICY_VIOLATION)
        return
    await websocket.accept()
    await websocket.send_bytes(encode(state.processor.policy_metadata()))
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            frame = message.get("bytes")
            if frame is None:
                await _send_error(websocket, bad_request("send observations as binary msgpack-numpy frames", "frame"))
                continue
            if len(frame) > state.config.openpi_frame_ceiling:  # uvicorn reads up to the largest route's ceiling
                await websocket.close(code=MESSAGE_TOO_BIG)
                return
            if len(frame) > state.config.max_ws_message_bytes:
                await _send_error(websocket, too_large(len(frame), state.config.max_ws_message_bytes))
                continue
            try:
                await websocket.send_bytes(encode(await infer(state, frame)))
            except WebSocketDisconnect:
                return  # the client left while its observation ran: nobody to answer, nothing went wrong
            except (ApiError, FrameError) as e:
                error = bad_request(str(e), e.where or "observation", "invalid_frame") if isinstance(e, FrameError) else e
                await _send_error(websocket, error)
            except Exception as e:  # never a traceback to the client; the log has it
                await _send_error(websocket, to_api_error(e))
    except WebSocketDisconnect:
        return


async def infer(state: AppState, frame: bytes) -> dict[str, Any]:
    """One observation frame -> openpi's answer: the action chunk and the server's timing."""
    t0 = time.monotonic()
    observation = decode(frame)
    if not isinstance(observation, dict):
        raise bad_request("an observation must be a msgpack map (a dict)", "observation", "invalid_frame")
    state.check_ready()
    spec = await state.build_request(TASK, {"observation": observation}, SamplingParams(), {})
    actions = None
    async for event in state.runner.events(spec, ROUTE):
        if isinstance(event, RequestFinished):
            if event.reason in (FinishReason.ERROR, FinishReason.ABORT) or actions is None:
                raise ApiError(500, f"the request failed inside the runtime: {event.error or event.reason}", None,
                               "request_failed")
            break
        if event.modality == "action" and isinstance(event.data, ArrayData):
            actions = np.frombuffer(event.data.data, dtype=event.data.dtype).reshape(event.data.shape)
    return {"actions": actions, "server_timing": {"infer_ms": (time.monotonic() - t0) * 1000.0}}


def too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"a frame of {size} bytes is over this server's limit of {limit} bytes", "frame",
                    "frame_too_large")


async def _send_error(websocket: WebSocket, error: ApiError) -> None:
    await websocket.send_text(json.dumps(error.envelope()))
