"""What every route shares: the router class, OpenAPI error responses, the JSON-or-stream answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from walkserve.api.disconnect import ClientGone, race_disconnect
from walkserve.api.errors import ApiError
from walkserve.api.route import CLIENT_GONE, StrictRoute
from walkserve.api.schemas.common import ErrorEnvelope
from walkserve.api.stream_response import StreamResponse

_DESCRIPTIONS = {
    400: "Invalid input; `param` names the field.",
    401: "Missing or wrong API key.",
    404: "Unknown model or route.",
    413: "Request body too large.",
    415: "Wrong Content-Type.",
    429: "Queue full; see Retry-After.",
    500: "Internal error (details in the server log).",
    503: "Starting, draining, or a dead worker.",
}
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorEnvelope, "description": d} for code, d in _DESCRIPTIONS.items()}


def router() -> APIRouter:
    return APIRouter(route_class=StrictRoute)


async def collect(request: Request, work: Awaitable[Any], to_response: Callable[[Any], Response] | None = None) -> Response:
    """Await a non-streamed answer; a client that disconnects meanwhile cancels (aborts) the work."""
    try:
        result = await race_disconnect(request.receive, work)
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    return to_response(result) if to_response else JSONResponse(result)


def stream(chunks: AsyncIterator[bytes], media_type: str, error_chunk: Callable[[ApiError], bytes] | None, headers: dict[str, str] | None = None) -> StreamResponse:
    return StreamResponse(chunks, media_type, headers, error_chunk)
