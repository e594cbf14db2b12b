"""/v1/images/generations and /v1/images/edits: n image requests, the final image of each, encoded."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from typing import Any

from walkserve.api.errors import bad_request
from walkserve.api.media.image_codec import encode_image
from walkserve.api.merge import EventMerger
from walkserve.api.openai.choices import failure
from walkserve.api.openai.plan import build_sampling, check_n, unsupported, with_seed_offset
from walkserve.api.state import AppState
from walkserve.core.array import ArrayData
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import RequestFinished
from walkserve.core.request import RequestSpec

ROUTE_GENERATIONS = "/v1/images/generations"
ROUTE_EDITS = "/v1/images/edits"


def parse_size(size: str | None, max_pixels: int) -> tuple[int, int] | None:
    """'WIDTHxHEIGHT' -> (width, height); None or 'auto' -> None (the model's default)."""
    if size in (None, "", "auto"):
        return None
    width_text, sep, height_text = size.partition("x")
    if not sep or not width_text.isdigit() or not height_text.isdigit():
        raise bad_request("size must be WIDTHxHEIGHT (e.g. 512x512) or auto", "size")
    width, height = int(width_text), int(height_text)
    if width < 1 or height < 1 or width * height > max_pixels:
        raise bad_request(f"size {width}x{height} is outside 1..{max_pixels} pixels", "size", "image_too_large")
    return width, height


def form_extensions(fields: dict[str, Any]) -> dict[str, Any]:
    """The extension fields of a multipart form, as JSON would give them (``cfg_interval`` as "a,b" or "[a, b]")."""
    out = {k: v for k, v in fields.items() if v is not None}
    interval = out.get("cfg_interval")
    if isinstance(interval, str):
        parts = interval.strip().strip("[]").split(",")
        try:
            out["cfg_interval"] = [float(p) for p in parts]
        except ValueError:
            raise bad_request("cfg_interval must be two numbers: start,end (e.g. 0.4,1.0)", "cfg_interval") from None
        if len(parts) != 2:
            raise bad_request("cfg_interval must be two numbers: start,end (e.g. 0.4,1.0)", "cfg_interval")
    return out


def interval_field(joined: str | None, items: list[str] | None) -> str | None:
    """``cfg_interval`` as one "start,end" field or as two ``cfg_interval[]`` fields (how the openai package
    writes a list into a form), not both."""
    if items is None:
        return joined
    if joined is not None:
        raise bad_request("give cfg_interval or cfg_interval[], not both", "cfg_interval")
    if len(items) != 2:
        raise bad_request("cfg_interval must be two numbers: start,end (e.g. 0.4,1.0)", "cfg_interval")
    return ",".join(items)


def check_response_format(response_format: str | None, stream: bool | None) -> None:
    """b64_json, answered whole: a streamed answer (OpenAI's partial images) is a 400, since the openai package
    would read the JSON answer as an SSE stream of no events."""
    if response_format not in (None, "b64_json"):
        raise bad_request("only response_format 'b64_json' is supported (this server does not host files)", "response_format", "unsupported_format")
    if stream:
        raise unsupported("stream", "streamed image generation (stream, partial_images)")


async def plan_images(
    state: AppState, payload: dict[str, Any], n: int, size: str | None, seed: int | None, steps: int | None,
    extensions: dict[str, Any] | None = None,
) -> list[RequestSpec]:
    """``n`` requests (seeds offset per image); ``extensions``: the model's own parameters the client set."""
    check_n(n, state.config)
    params: dict[str, Any] = dict(extensions or {})
    if (dims := parse_size(size, state.config.max_image_pixels)) is not None:
        params["size"] = dims
    if steps is not None:
        params["steps"] = steps
    sampling = build_sampling(state.card, {"seed": seed} if seed is not None else {})
    return [await state.build_request("image", payload, with_seed_offset(sampling, i), params) for i in range(n)]


async def generate_images(state: AppState, specs: list[RequestSpec], route: str) -> list[ArrayData]:
    """The last image output of every request, in request order."""
    images: list[ArrayData | None] = [None] * len(specs)
    merger = EventMerger([state.runner.events(spec, route) for spec in specs])
    async with contextlib.aclosing(merger.items()) as items:
        async for index, event in items:
            if isinstance(event, RequestFinished):
                if event.reason in (FinishReason.ERROR, FinishReason.ABORT):
                    raise failure(event)
            elif event.modality == "image" and isinstance(event.data, ArrayData):
                images[index] = event.data
    missing = [i for i, image in enumerate(images) if image is None]
    if missing:
        raise failure(RequestFinished(specs[missing[0]].id, FinishReason.ERROR, "the model produced no image"))
    return [image for image in images if image is not None]


async def images_response(state: AppState, specs: list[RequestSpec], route: str, output_format: str) -> dict[str, Any]:
    images = await generate_images(state, specs, route)
    encoded = [await asyncio.to_thread(encode_image, image, output_format) for image in images]
    return {
        "created": int(time.time()),
        "data": [{"b64_json": base64.b64encode(data).decode()} for data in encoded],
        "output_format": output_format,
    }
