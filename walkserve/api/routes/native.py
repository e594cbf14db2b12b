"""POST /v1/generate: NDJSON events of every output modality."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from walkserve.api.disconnect import race_disconnect
from walkserve.api.native.generate import generate_collect, generate_stream, plan_generate
from walkserve.api.routes.common import ERRORS, collect, router, stream
from walkserve.api.schemas.generate import GenerateRequest
from walkserve.api.sse import ndjson_error
from walkserve.api.state import app_state

routes = router()


@routes.post("/v1/generate", responses=ERRORS, summary="Native generation: NDJSON events of any modality")
async def generate(body: GenerateRequest, request: Request) -> Response:
    state = app_state(request)
    state.check_ready()
    state.check_model(body.model)
    plan = await race_disconnect(request.receive, plan_generate(state, body))  # big inputs take a while to plan
    if body.stream:
        return stream(generate_stream(state, plan), "application/x-ndjson", ndjson_error)
    return await collect(request, generate_collect(state, plan))
