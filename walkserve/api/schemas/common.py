"""Shared field types and the sampling fields of the text routes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from walkserve.core.sampling import MAX_SEED

I32 = 2**31 - 1

# Numbers are strict (a JSON string or bool is not a number) and bounded, so 2**63 or 1e308 is a 400.
Count = Annotated[int, Field(strict=True, ge=1, le=I32)]
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=I32)]
TokenId = Annotated[int, Field(strict=True, ge=0, le=I32)]
Seed = Annotated[int, Field(strict=True, ge=0, le=MAX_SEED)]
# A multipart form's fields are all strings: its numbers parse from their text (still bounded).
FormSeed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Float = Annotated[float, Field(strict=True)]
JsonInt = Annotated[int, Field(strict=True, ge=-(2**53), le=2**53)]


def null_is(default: Any) -> AfterValidator:
    """For a field OpenAI declares nullable: null (what the openai client sends for ``n=None``) means ``default``."""
    return AfterValidator(lambda value: default if value is None else value)


Flag = Annotated[bool | None, null_is(False)]  # stream, echo: null is false


class ApiModel(BaseModel):
    """Unknown fields are ignored (OpenAI clients send extras); NaN and Infinity never validate."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)


class ErrorBody(ApiModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(ApiModel):
    """Every error response, from every route: ``{"error": {...}}``."""

    error: ErrorBody


class StreamOptions(ApiModel):
    include_usage: bool = False


class SamplingFields(ApiModel):
    """OpenAI's sampling fields plus the usual serving extensions (top_k, min_p, ...)."""

    max_tokens: Count | None = None
    temperature: Annotated[Float, Field(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[Float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(strict=True, ge=0, le=2**30)] | None = None
    min_p: Annotated[Float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[Float, Field(ge=0.01, le=100.0)] | None = None
    presence_penalty: Annotated[Float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[Float, Field(ge=-2.0, le=2.0)] | None = None
    min_tokens: NonNegInt | None = None
    seed: Seed | None = None
    n: Annotated[Annotated[int, Field(strict=True, ge=1, le=128)] | None, null_is(1)] = 1
    stop: str | Annotated[list[str], Field(max_length=64)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=64)] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # {token id as a decimal string: bias in [-100, 100]}, as OpenAI sends it
    logit_bias: Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")], Float], Field(max_length=300)] | None = None

    def sampling_overrides(self) -> dict[str, Any]:
        """The SamplingParams fields the client set (None means: the model's default)."""
        names = (
            "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "min_tokens", "seed",
        )
        out = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        if self.stop_token_ids:
            out["stop_token_ids"] = tuple(self.stop_token_ids)
        if self.ignore_eos:
            out["ignore_eos"] = True
        if self.logit_bias:
            out["logit_bias"] = tuple((int(key), value) for key, value in self.logit_bias.items())
        return out

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def model_field() -> Any:
    return Field(None, max_length=256, description="The served model id or an alias; optional.")
