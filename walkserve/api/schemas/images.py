"""POST /v1/images/generations (JSON) and /v1/images/edits (multipart)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from walkserve.api.schemas.common import ApiModel, Seed, model_field

SIZE_PATTERN = r"^(auto|[1-9][0-9]{0,4}x[1-9][0-9]{0,4})$"


class ImageGenerationRequest(ApiModel):
    model: str | None = model_field()
    prompt: str = Field(min_length=1, max_length=32000)
    n: Annotated[int, Field(strict=True, ge=1, le=128)] = 1
    size: str | None = Field(None, pattern=SIZE_PATTERN, description="WIDTHxHEIGHT or auto")
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png", "jpeg", "webp"] = "png"
    quality: str | None = None
    style: str | None = None
    background: str | None = None
    user: str | None = None
    seed: Seed | None = None
    steps: Annotated[int, Field(strict=True, ge=1, le=1000)] | None = None
