"""POST /v1/images/generations (JSON) and /v1/images/edits (multipart)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from walkserve.api.schemas.common import ApiModel, Float, Seed, model_field

SIZE_PATTERN = r"^(auto|[1-9][0-9]{0,4}x[1-9][0-9]{0,4})$"
# A model's own generation parameters (BAGEL's flow and guidance), passed on when set; the model checks them.
EXTENSION_FIELDS = ("num_timesteps", "cfg_text_scale", "cfg_img_scale", "cfg_interval", "cfg_renorm_type",
                    "cfg_renorm_min", "timestep_shift", "think")


class ImageExtensions(ApiModel):
    num_timesteps: Annotated[int, Field(strict=True, ge=-(2**31), le=2**31 - 1)] | None = None
    cfg_text_scale: Float | None = None
    cfg_img_scale: Float | None = None
    cfg_interval: Annotated[list[Float], Field(min_length=2, max_length=2)] | None = None
    cfg_renorm_type: Annotated[str, Field(max_length=32)] | None = None
    cfg_renorm_min: Float | None = None
    timestep_shift: Float | None = None
    think: bool | None = None

    def extensions(self) -> dict:
        """The extension fields the client set (None: the model's default)."""
        return {name: getattr(self, name) for name in EXTENSION_FIELDS if getattr(self, name) is not None}


class ImageGenerationRequest(ImageExtensions):
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
