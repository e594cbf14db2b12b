"""The JSON answers of /v1/audio/transcriptions and /v1/audio/translations (for the OpenAPI document)."""

from __future__ import annotations

from typing import Literal

from walkserve.api.schemas.common import ApiModel


class TokenUsage(ApiModel):
    type: Literal["tokens"]
    input_tokens: int
    output_tokens: int
    total_tokens: int


class DurationUsage(ApiModel):
    type: Literal["duration"]
    seconds: float


class TranscriptionJson(ApiModel):
    """response_format json."""

    text: str
    usage: TokenUsage


class Segment(ApiModel):
    id: int
    seek: int
    start: float
    end: float
    text: str
    temperature: float
    compression_ratio: float


class TranscriptionVerboseJson(ApiModel):
    """response_format verbose_json: one segment spanning the audio (the model gives no timestamps)."""

    task: Literal["transcribe", "translate"]
    language: str
    duration: float
    text: str
    segments: list[Segment]
    usage: DurationUsage
