"""POST /v1/embeddings."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from walkserve.api.openai.embeddings import embeddings as compute_embeddings
from walkserve.api.routes.common import ERRORS, collect, router
from walkserve.api.schemas.embeddings import EmbeddingsRequest
from walkserve.api.state import app_state

routes = router()


@routes.post("/v1/embeddings", responses=ERRORS, summary="Embeddings (OpenAI's shape; media inputs for video models)")
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    state = app_state(request)
    state.check_ready()
    state.check_model(body.model)
    return await collect(request, compute_embeddings(state, body))
