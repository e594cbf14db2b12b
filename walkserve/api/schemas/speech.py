"""POST /v1/audio/speech."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from walkserve.api.schemas.common import ApiModel, Count, Float, NonNegInt, Seed, model_field


class SpeechRequest(ApiModel):
    model: str | None = model_field()
    input: str = Field(min_length=1, description="The text to speak.")
    voice: str | None = Field(None, max_length=128, description="One of the model's voices (see /v1/models).")
    instructions: str | None = Field(None, max_length=4096)
    response_format: str | None = Field(None, max_length=16, description="mp3, opus, aac, flac, wav or pcm; what is installed.")
    speed: Annotated[Float, Field(ge=0.25, le=4.0)] = 1.0
    stream_format: Literal["audio", "sse"] = "audio"
    seed: Seed | None = None
    max_tokens: Count | None = Field(
        None, description="walkserve extension: the most model tokens to generate (bounds the audio's length; Orpheus makes 7 per 85 ms frame)."
    )
    min_tokens: NonNegInt | None = Field(
        None, description="walkserve extension: the fewest model tokens to generate before end-of-speech may end the audio."
    )
