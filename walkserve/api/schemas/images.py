"""POST /v1/images/generations (JSON) and /v1/images/edits (multipart)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from walkserve.api.schemas.common import ApiModel, Seed, model_field, null_is

SIZE_PATTERN = r"^(auto|[1-9][0-9]{0,4}x[1-9][0-9]{0,4})$"
# A model's own generation parameters (BAGEL's flow and guidance), passed on when set; the model checks them.
EXTENSION_FIELDS = ("num_timesteps", "cfg_text_scale", "cfg_img_scale", "cfg_interval", "cfg_renorm_type",
                    "cfg_renorm_min", "timestep_shift", "think")
# Their ranges (BAGEL's, ``walkserve/models/bagel/params.py``; a test keeps the two in step), declared here so
# /openapi.json shows them and both image routes refuse an out-of-range value at the edge.
MAX_TIMESTEPS = 1000
MAX_SCALE = 20.0
MAX_SHIFT = 100.0
RENORM_TYPES = ("global", "channel", "text_channel")
RenormType = Literal["global", "channel", "text_channel"]
Scale = Annotated[float, Field(strict=True, ge=0.0, le=MAX_SCALE)]
Unit = Annotated[float, Field(strict=True, ge=0.0, le=1.0)]
Shift = Annotated[float, Field(strict=True, gt=0.0, le=MAX_SHIFT)]
Timesteps = Annotated[int, Field(strict=True, ge=2, le=MAX_TIMESTEPS)]


class ImageExtensions(ApiModel):
    num_timesteps: Timesteps | None = None
    cfg_text_scale: Scale | None = None
    cfg_img_scale: Scale | None = None
    cfg_interval: Annotated[list[Unit], Field(min_length=2, max_length=2, description="[start, end], start <= end")] | None = None
    cfg_renorm_type: RenormType | None = None
    cfg_renorm_min: Unit | None = None
    timestep_shift: Shift | None = None
    think: bool | None = None

    def extensions(self) -> dict:
        """The extension fields the client set (None: the model's default)."""
        return {name: getattr(self, name) for name in EXTENSION_FIELDS if getattr(self, name) is not None}


class ImageGenerationRequest(ImageExtensions):
    model: str | None = model_field()
    prompt: str = Field(min_length=1, max_length=32000)
    n: Annotated[Annotated[int, Field(strict=True, ge=1, le=128)] | None, null_is(1)] = 1
    size: str | None = Field(None, pattern=SIZE_PATTERN, description="WIDTHxHEIGHT or auto")
    response_format: Literal["b64_json", "url"] | None = None
    stream: bool | None = Field(None, description="not supported: true is a 400 (images are answered whole)")
    output_format: Annotated[Literal["png", "jpeg", "webp"] | None, null_is("png")] = "png"
    quality: str | None = None
    style: str | None = None
    background: str | None = None
    user: str | None = None
    seed: Seed | None = None
    steps: Annotated[int, Field(strict=True, ge=1, le=MAX_TIMESTEPS - 1)] | None = None
