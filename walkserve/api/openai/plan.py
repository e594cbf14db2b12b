"""Shared planning steps of the text routes: sampling, n, stop strings, context fit, usage."""

from __future__ import annotations

import dataclasses
from typing import Any

from walkserve.api.config import ServerConfig
from walkserve.api.errors import ApiError, bad_request
from walkserve.api.openai.choices import LogprobJoiner
from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import MAX_SEED, SamplingParams
from walkserve.models.processor import ModelCard

PROMPT_IDS = "prompt_token_ids"  # RequestSpec.inputs key whose length is the prompt length (when a processor sets it)
MAX_STOP_CHARS = 256
_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


def build_sampling(card: ModelCard, overrides: dict[str, Any], stops: tuple[str, ...] = ()) -> SamplingParams:
    """The model's default sampling, then the client's fields; SamplingParams validates the result."""
    values = {k: v for k, v in card.default_sampling.items() if k in _SAMPLING_FIELDS}
    values.update(overrides)
    if stops:
        values["stop"] = stops
    try:
        return SamplingParams(**values)
    except InvalidRequest as e:
        raise bad_request(str(e), e.param) from None


def with_seed_offset(sampling: SamplingParams, offset: int) -> SamplingParams:
    """Choice ``offset`` of n: a different (still reproducible) seed when the client gave one."""
    if sampling.seed is None or offset == 0:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + offset) % (MAX_SEED + 1))


def check_n(n: int, config: ServerConfig, param: str = "n") -> None:
    if n > config.max_n:
        raise bad_request(f"{param} is {n}; this server allows at most {config.max_n}", param, "n_too_large")


def check_stops(stops: tuple[str, ...], config: ServerConfig) -> None:
    if len(stops) > config.max_stop_strings:
        raise bad_request(f"at most {config.max_stop_strings} stop strings", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(f"stop strings are limited to {MAX_STOP_CHARS} characters", "stop")


def prompt_length(spec: RequestSpec) -> int | None:
    ids = spec.inputs.get(PROMPT_IDS)
    if isinstance(ids, ArrayData):
        return ids.numel
    if isinstance(ids, list):
        return len(ids)
    return None


def fit_context(spec: RequestSpec, card: ModelCard, explicit: bool, prompt_param: str) -> None:
    """Prompt + max_tokens must fit the context: 400 when the client asked for too much,
    otherwise max_tokens shrinks to the room that is left."""
    limit = card.max_context
    length = prompt_length(spec)
    max_tokens = spec.sampling.max_tokens
    if length is None:
        if max_tokens > limit:
            raise bad_request(f"max_tokens {max_tokens} exceeds the model's context of {limit} tokens", "max_tokens")
        return
    if length >= limit:
        raise bad_request(f"the prompt has {length} tokens; the model's context is {limit}", prompt_param, "context_length_exceeded")
    room = limit - length
    if max_tokens > room:
        if explicit:
            raise bad_request(
                f"prompt ({length} tokens) + max_tokens ({max_tokens}) exceeds the model's context of {limit} tokens",
                "max_tokens",
                "context_length_exceeded",
            )
        spec.sampling = dataclasses.replace(spec.sampling, max_tokens=room)


def default_max_tokens(card: ModelCard) -> int:
    """Chat's default when the client sets none: the model's default, else the whole context (shrunk by fit_context)."""
    value = card.default_sampling.get("max_tokens")
    return int(value) if isinstance(value, int) and value > 0 else card.max_context


def logprob_joiner(state, param: str) -> LogprobJoiner:
    """A joiner for a call that asked for logprobs; 400 when the served model cannot give them."""
    if "logprobs" not in state.card.capabilities:
        raise unsupported(param, f"logprobs for model {state.card.id!r}")
    return LogprobJoiner(state.processor.token_bytes)


def unsupported(param: str, what: str) -> ApiError:
    return bad_request(f"{what} is not supported by this server", param, "unsupported_parameter")
