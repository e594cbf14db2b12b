"""POST /v1/completions."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from walkserve.api.schemas.common import Flag, SamplingFields, StreamOptions, TokenId, model_field

TokenIds = Annotated[list[TokenId], Field(min_length=1, max_length=1_000_000)]
Prompt = str | TokenIds | Annotated[list[str], Field(min_length=1, max_length=64)] | Annotated[list[TokenIds], Field(min_length=1, max_length=64)]


class CompletionRequest(SamplingFields):
    model: str | None = model_field()
    prompt: Prompt
    stream: Flag = False
    stream_options: StreamOptions | None = None
    echo: Flag = False
    logprobs: Annotated[int, Field(strict=True, ge=0, le=5)] | None = None
    best_of: Annotated[int, Field(strict=True, ge=1, le=128)] | None = None
    suffix: str | None = None
    user: str | None = None
