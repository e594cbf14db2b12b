"""GET /v1/requests/{request_id}/timeline: a recent request's timeline as Chrome/Perfetto trace JSON."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from walkserve.api.errors import ApiError
from walkserve.api.routes.common import ERRORS, router
from walkserve.api.state import app_state
from walkserve.entrypoint.chrome_trace import chrome_trace

routes = router()


@routes.get("/v1/requests/{request_id}/timeline", responses=ERRORS,
            summary="A recent request's timeline, node by node and rank by rank (Chrome/Perfetto trace-event JSON)")
async def timeline(request_id: str, request: Request) -> JSONResponse:
    store = app_state(request).engine.timeline
    if store is None:
        raise ApiError(404, "request timelines are off on this server (walkserve serve --timelines N)", "request_id",
                       "timelines_off")
    trace = store.get(request_id)
    if trace is None:
        raise ApiError(404, f"no recent request {request_id!r} (the server keeps the last {store.keep})", "request_id",
                       "request_not_found")
    return JSONResponse(chrome_trace(trace, store.pid))
