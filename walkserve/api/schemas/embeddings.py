"""POST /v1/embeddings: OpenAI's request shape; ``input`` may also be media (the extension a video model takes)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from walkserve.api.schemas.common import ApiModel, Count, model_field
from walkserve.api.schemas.generate import Scalar, TypedInput

EmbeddingInput = TypedInput | Annotated[str, Field(max_length=1_000_000)]


class EmbeddingsRequest(ApiModel):
    model: str | None = model_field()
    input: EmbeddingInput | Annotated[list[EmbeddingInput], Field(min_length=1, max_length=64)] = Field(
        description="One input or a list; a video model takes frames (an array), an image or a video.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Count | None = None
    user: str | None = None
    params: Annotated[dict[str, Scalar | Annotated[list[Scalar], Field(max_length=4096)]], Field(max_length=64)] = Field(
        default_factory=dict, description="The model's request parameters (a video model: clip_frames, resize).")
