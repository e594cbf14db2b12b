"""/openapi.json describes what the server really accepts and answers (so a schema-driven fuzzer explores it)."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from walkserve.api import ServerConfig, build_app
from walkserve.api.routes.images import edits
from walkserve.models.bagel import params as bagel
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

ROOT = Path(__file__).resolve().parents[2]
EDITS = "Body_edits_v1_images_edits_post"
PASS_THROUGH = ("/v1/generate.inputs", "/v1/generate.params", "/v1/embeddings.params")  # any JSON, the model reads it


def document(**config) -> tuple[dict, Any]:
    app = build_app(FakeEngine(FakeEngineConfig(audio=True, images=True)), ServerConfig(**config))
    return app.openapi(), app.state.walkserve


@pytest.fixture(scope="module")
def doc() -> dict:
    return document()[0]


def resolve(doc: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def leaves(doc: dict, schema: dict, path: str, seen: frozenset = frozenset()):
    """(path, schema) of every typed node of a request body, references followed once."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name in seen:
            return
        seen, schema = seen | {name}, resolve(doc, schema)
    for key in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(key, []):
            yield from leaves(doc, option, path, seen)
    if "type" in schema:
        yield path, schema
    if "items" in schema:
        yield from leaves(doc, schema["items"], f"{path}[]", seen)
    for name, sub in schema.get("properties", {}).items():
        yield from leaves(doc, sub, f"{path}.{name}", seen)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from leaves(doc, schema["additionalProperties"], path, seen)


def request_bodies(doc: dict):
    for route, operations in doc["paths"].items():
        for operation in operations.values():
            for media_type, content in operation.get("requestBody", {}).get("content", {}).items():
                yield route, media_type, content["schema"]


def test_the_multipart_route_declares_every_form_field_with_its_type(doc):
    [(media_type, body)] = [(m, s) for r, m, s in request_bodies(doc) if r == "/v1/images/edits"]
    assert media_type == "multipart/form-data"
    form = resolve(doc, body)
    hints = typing.get_type_hints(edits, include_extras=True)
    fields = {next((m.alias for m in hints[name].__metadata__ if getattr(m, "alias", None)), name)
              for name in inspect.signature(edits).parameters if name != "request"}
    assert set(form["properties"]) == fields and {"image[]", "cfg_interval[]"} <= fields
    assert form["required"] == ["prompt"]
    for name in ("image", "image[]"):
        files = form["properties"][name]["anyOf"][0]
        assert files["type"] == "array" and files["items"]["contentMediaType"] == "application/octet-stream"
        assert files["maxItems"] == ServerConfig.max_media_parts
    assert form["properties"]["mask"]["anyOf"][0]["contentMediaType"] == "application/octet-stream"
    assert form["properties"]["output_format"]["enum"] == ["png", "jpeg", "webp"]
    assert form["properties"]["cfg_renorm_type"]["anyOf"][0]["enum"] == list(bagel.RENORM_TYPES)


def test_every_number_a_request_can_carry_is_bounded(doc):
    """Every integer and number field of every body (JSON and multipart) states its range, except the free-form
    ``inputs``/``params`` maps whose meaning is the model's."""
    unbounded = [
        (route, path) for route, _, body in request_bodies(doc) for path, schema in leaves(doc, body, route)
        if schema.get("type") in ("integer", "number") and not path.startswith(PASS_THROUGH)
        and not ({"minimum", "exclusiveMinimum"} & set(schema) and {"maximum", "exclusiveMaximum"} & set(schema))
    ]
    assert unbounded == []


@pytest.mark.parametrize("route", ["/v1/images/generations", "/v1/images/edits"])
def test_image_extension_ranges_are_bagels(doc, route):
    """The image routes declare (and enforce at the edge) the ranges BAGEL's own parameter check applies."""
    [body] = [s for r, _, s in request_bodies(doc) if r == route]
    fields = {path.rsplit(".", 1)[1]: s for path, s in leaves(doc, body, "") if s.get("type") in ("integer", "number")}
    assert (fields["num_timesteps"]["minimum"], fields["num_timesteps"]["maximum"]) == (2, bagel.MAX_TIMESTEPS)
    for name in ("cfg_text_scale", "cfg_img_scale"):
        assert (fields[name]["minimum"], fields[name]["maximum"]) == (0, bagel.MAX_SCALE)
    assert (fields["cfg_renorm_min"]["minimum"], fields["cfg_renorm_min"]["maximum"]) == (0, 1)
    assert (fields["timestep_shift"]["exclusiveMinimum"], fields["timestep_shift"]["maximum"]) == (0, bagel.MAX_SHIFT)


def test_errors_are_documented_as_the_envelope_and_never_as_422(doc):
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for route, operations in doc["paths"].items():
        for operation in operations.values():
            assert "422" not in operation["responses"], route
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorEnvelope"}, (route, status)


def test_the_server_limits_and_names_are_in_the_schema():
    doc, state = document(max_n=3, max_speech_chars=100, max_media_parts=2, model_aliases=("house-model",))
    schemas = doc["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest", "ImageGenerationRequest", EDITS):
        assert schemas[name]["properties"]["n"]["maximum"] == 3, name
        assert schemas[name]["properties"]["model"]["anyOf"][0]["enum"] == ["fake-tiny", "house-model"], name
    [parameter] = doc["paths"]["/v1/models/{model}"]["get"]["parameters"]
    assert parameter["schema"]["enum"] == ["fake-tiny", "house-model"]
    speech = schemas["SpeechRequest"]["properties"]
    assert speech["input"]["maxLength"] == 100
    assert speech["response_format"]["anyOf"][0]["enum"] == state.audio.names
    assert schemas[EDITS]["properties"]["image"]["anyOf"][0]["maxItems"] == 2


def test_websocket_routes_are_listed_as_documented_exceptions(doc):
    listed = {route["path"]: route for route in doc["x-websocket-routes"]}
    assert set(listed) == {"/v1/openpi", "/", "/v1/realtime"}
    assert [listed[p]["protocol"] for p in ("/v1/openpi", "/", "/v1/realtime")] == ["openpi", "openpi", "openai-realtime"]
    assert all(f"`{path}`" in doc["info"]["description"] for path in listed)
    assert not set(listed) & set(doc["paths"])  # not HTTP operations
    api_doc = (ROOT / "docs" / "api.md").read_text()
    assert "x-websocket-routes" in api_doc and re.search(r"max_ws_message_bytes", api_doc)
