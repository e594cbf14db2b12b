"""POST /v1/generate: the native route for any input and output modality."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from walkserve.api.schemas.common import ApiModel, Float, JsonInt, SamplingFields, model_field

DTYPES = Literal["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
Scalar = str | JsonInt | Float | bool | None


class ArrayInput(ApiModel):
    """A tensor: dtype, shape and base64 of its C-contiguous little-endian bytes."""

    type: Literal["array"]
    dtype: DTYPES
    shape: Annotated[list[Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]], Field(max_length=8)]
    data: str


class ImageInput(ApiModel):
    type: Literal["image"]
    url: str = Field(description="A data: URL, or an allowlisted http(s) URL.")


class AudioInput(ApiModel):
    type: Literal["audio"]
    url: str = Field(description="A data: URL, or an allowlisted http(s) URL.")


class VideoInput(ApiModel):
    type: Literal["video"]
    url: str = Field(description="A video file as a data: URL or an allowlisted http(s) URL, or its frames as "
                                 "data:video/jpeg;base64,<frame>,<frame>,... (or video/png).")


TypedInput = Annotated[ArrayInput | ImageInput | AudioInput | VideoInput, Field(discriminator="type")]
MAX_IMAGE_PARTS = 768  # a list of image parts holds as many as a frames data URL (media.loader.MAX_VIDEO_FRAMES)
# Several images (a video's frames, a request's pictures): one input, each decoded, passed on as a list.
ImageList = Annotated[list[ImageInput], Field(min_length=1, max_length=MAX_IMAGE_PARTS)]
InputValue = TypedInput | Scalar | Annotated[list[JsonInt | Float], Field(max_length=1_000_000)] | ImageList


class SamplingBody(SamplingFields):
    n: Annotated[int, Field(strict=True, ge=1, le=1)] = 1
    logprobs: Annotated[int, Field(strict=True, ge=0, le=20)] | None = None  # top-k per token; models with `logprobs`


class GenerateRequest(ApiModel):
    model: str | None = model_field()
    task: Literal["generate", "completion", "chat", "speech", "image", "act", "encode", "predict", "rollout", "plan"] = "generate"
    inputs: Annotated[dict[str, InputValue], Field(max_length=64)] = Field(default_factory=dict)
    modalities: Annotated[list[Annotated[str, Field(max_length=32)]], Field(min_length=1, max_length=8)] | None = None
    sampling: SamplingBody | None = None
    params: Annotated[dict[str, Scalar | Annotated[list[Scalar], Field(max_length=4096)]], Field(max_length=64)] = Field(default_factory=dict)
    stream: bool = True
    audio_encoding: Literal["pcm16", "float32"] = "pcm16"
    image_format: Literal["png", "raw"] = "png"
