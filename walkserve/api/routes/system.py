"""GET /health, GET /v1/models[/{model}], GET /metrics."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from walkserve.api.errors import ApiError, scrub, unavailable
from walkserve.api.routes.common import ERRORS, router
from walkserve.api.state import AppState, app_state

routes = router()
STARTED = int(time.time())


@routes.get("/health", responses={503: ERRORS[503]}, summary="200 when the model runtime is ready")
async def health(request: Request) -> JSONResponse:
    state = app_state(request)
    report = state.health()
    status = "draining" if state.drain.draining else report.state
    body: dict[str, Any] = {"status": status, "ok": report.ok and not state.drain.draining, "detail": scrub(report.detail)}
    body["workers"] = {str(rank): alive for rank, alive in report.workers.items()}
    if body["ok"]:
        return JSONResponse(body)
    error = unavailable(f"not ready: {status}", f"health_{status}")
    return JSONResponse({**error.envelope(), **body}, status_code=503)


def model_entry(state: AppState) -> dict[str, Any]:
    card = state.card
    return {
        "id": card.id,
        "object": "model",
        "created": STARTED,
        "owned_by": "walkserve",
        "family": card.family,
        "capabilities": sorted(card.capabilities),
        "random_weights": card.random_weights,
        "max_context": state.served_context(),
        "voices": list(card.voices),
        "default_voice": card.default_voice,
        "sample_rate": card.sample_rate,
        "audio_formats": state.audio.names,
        "aliases": list(state.config.model_aliases),
        "description": card.description,
    }


@routes.get("/v1/models", responses=ERRORS, summary="The served model (OpenAI list format)")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [model_entry(app_state(request))]}


@routes.get("/v1/models/{model}", responses=ERRORS, summary="One model by id or alias")
async def get_model(model: str, request: Request) -> dict[str, Any]:
    state = app_state(request)
    if model not in state.model_names:
        raise ApiError(404, f"model {model!r} is not served here", "model", "model_not_found")
    return model_entry(state)


@routes.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(app_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
