"""build_app: the ASGI application for one EngineClient."""

from __future__ import annotations

from fastapi import FastAPI

from walkserve.api.auth import ApiKeyMiddleware
from walkserve.api.body_limit import BodyLimitMiddleware
from walkserve.api.config import ServerConfig
from walkserve.api.drain import DrainMiddleware
from walkserve.api.handlers import install_error_handlers, install_fallback_handler
from walkserve.api.http_metrics import HttpMetricsMiddleware
from walkserve.api.openapi_doc import openapi_document
from walkserve.api.route import StrictRoute
from walkserve.api.routes import (
    audio,
    embeddings,
    images,
    native,
    openpi,
    playground,
    realtime,
    system,
    text,
    timeline,
    transcriptions,
)
from walkserve.api.state import AppState
from walkserve.api.tracing import RequestTraceMiddleware
from walkserve.entrypoint.interface import EngineClient

DESCRIPTION = "OpenAI-compatible routes and a native NDJSON route for one composite multimodal model."


def build_app(engine: EngineClient, config: ServerConfig | None = None) -> FastAPI:
    """The server's ASGI app. It never starts or stops the engine; ``serve`` does the drain and shutdown.

    Middleware, outermost first: response counting, API key, drain gate,
    body size cap, request ids and traces (when the engine keeps timelines); then the routes
    (strict JSON, pydantic validation).
    """
    config = config or ServerConfig()
    state = AppState(engine, config)
    app = FastAPI(title="walkserve", version="0.1.0", description=DESCRIPTION, docs_url="/docs", redoc_url=None)
    app.router.route_class = StrictRoute
    app.state.walkserve = state
    for module in (system, text, audio, transcriptions, images, native, embeddings, openpi, realtime, playground, timeline):
        app.include_router(module.routes)
    app.openapi = lambda: openapi_document(app, state)  # type: ignore[method-assign]
    install_error_handlers(app)
    install_fallback_handler(app)
    if engine.timeline is not None:
        app.add_middleware(RequestTraceMiddleware, store=engine.timeline)
    app.add_middleware(BodyLimitMiddleware, limit=config.max_body_bytes)
    app.add_middleware(DrainMiddleware, state=state.drain)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    app.add_middleware(HttpMetricsMiddleware, metrics=state.metrics)
    return app
