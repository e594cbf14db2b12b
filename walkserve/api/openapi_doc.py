"""The /openapi.json document: FastAPI's, made true for this server.

FastAPI describes the routes from their pydantic models. Three things it cannot
know are added here, so a client (or a schema-driven fuzzer) sees what the
server really accepts and answers:

- what this server serves and the limits it was started with (``ServerConfig``):
  the model names, ``n``, the speech input's length, the images per edit, the
  installed audio formats;
- the error answers: every 4xx/5xx is the ``ErrorEnvelope``; FastAPI's own
  422 ``HTTPValidationError`` is never sent (a validation error is a 400);
- the WebSocket routes, which OpenAPI cannot describe as operations: listed
  under ``x-websocket-routes`` and in the description (docs/api.md has the protocol).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from walkserve.api.openpi.policy_socket import ROUTE as OPENPI_ROUTE
from walkserve.api.realtime.response import ROUTE as REALTIME_ROUTE
from walkserve.api.state import AppState

WEBSOCKET_ROUTES = [
    {"path": path, "protocol": "openpi", "capability": "act",
     "description": "openpi's policy protocol: binary msgpack-numpy frames (metadata, then one observation -> one "
                    "action chunk); errors come back as a text frame holding the ErrorEnvelope"}
    for path in (OPENPI_ROUTE, "/")
] + [{"path": REALTIME_ROUTE, "protocol": "openai-realtime", "capability": "chat",
      "description": "the OpenAI Realtime API (GA events): JSON client events in, server events out, audio as base64 "
                     "pcm16 at 24 kHz; GET /v1/realtime?model=ID upgrades (docs/api.md)"}]
N_FIELDS = ("CompletionRequest", "ChatCompletionRequest", "ImageGenerationRequest", "Body_edits_v1_images_edits_post")


def openapi_document(app: FastAPI, state: AppState) -> dict[str, Any]:
    """The document served at /openapi.json (built once, then cached on the app like FastAPI's own)."""
    if app.openapi_schema is None:
        routes = ", ".join(f"`{r['path']}`" for r in WEBSOCKET_ROUTES)
        description = f"{app.description}\n\nWebSocket routes (not OpenAPI operations; see `x-websocket-routes`): {routes}."
        document = get_openapi(title=app.title, version=app.version, description=description, routes=app.routes)
        _drop_validation_error(document)
        _apply_limits(document["components"]["schemas"], state)
        _model_path_parameter(document, state)
        document["x-websocket-routes"] = WEBSOCKET_ROUTES
        app.openapi_schema = document
    return app.openapi_schema


def _drop_validation_error(document: dict[str, Any]) -> None:
    for operations in document["paths"].values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    for name in ("HTTPValidationError", "ValidationError"):
        document["components"]["schemas"].pop(name, None)


def _model_path_parameter(document: dict[str, Any], state: AppState) -> None:
    for operation in document["paths"].get("/v1/models/{model}", {}).values():
        for parameter in operation.get("parameters", []):
            if parameter["name"] == "model":
                parameter["schema"]["enum"] = list(state.model_names)


def _apply_limits(schemas: dict[str, Any], state: AppState) -> None:
    config = state.config
    for schema in schemas.values():  # ``model``: the served id or an alias, nothing else
        model = schema.get("properties", {}).get("model", {})
        for choice in model.get("anyOf", []):
            if choice.get("type") == "string":
                choice.pop("maxLength", None)
                choice["enum"] = list(state.model_names)
    for name in N_FIELDS:
        if name in schemas:
            n = schemas[name]["properties"]["n"]
            n["maximum"] = min(n.get("maximum", config.max_n), config.max_n)
    if "SpeechRequest" in schemas:
        speech = schemas["SpeechRequest"]["properties"]
        speech["input"]["maxLength"] = config.max_speech_chars
        formats = speech["response_format"]["anyOf"][0]
        formats.pop("maxLength", None)
        formats["enum"] = list(state.audio.names)
    edits = schemas.get("Body_edits_v1_images_edits_post", {}).get("properties", {})
    for field in ("image", "image[]"):
        if field in edits:
            edits[field]["anyOf"][0]["maxItems"] = config.max_media_parts
