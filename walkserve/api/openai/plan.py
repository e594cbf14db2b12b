"""Shared planning steps of the text routes: sampling, n, stop strings, context fit, usage."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from walkserve.api.config import ServerConfig
from walkserve.api.errors import ApiError, bad_request
from walkserve.api.openai.choices import LogprobJoiner
from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.core.ids import new_request_id
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import MAX_SEED, SamplingParams
from walkserve.models.processor import ModelCard

if TYPE_CHECKING:
    from walkserve.api.state import AppState

PROMPT_IDS = "prompt_token_ids"  # RequestSpec.inputs key whose length is the prompt length (when a processor sets it)
MAX_STOP_CHARS = 256
_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


def build_sampling(card: ModelCard, overrides: dict[str, Any], stops: tuple[str, ...] = ()) -> SamplingParams:
    """The model's default sampling, then the client's fields; SamplingParams validates the result.

    ``max_tokens`` is the client's or None: the processor fits it to the context (None: the room
    left) and ``apply_default_max_tokens`` then lowers it to the card's default.
    """
    low, high = overrides.get("min_tokens"), overrides.get("max_tokens")
    if low is not None and high is not None and low > high:  # the client's own bounds cross
        raise bad_request(f"min_tokens ({low}) must not exceed max_tokens ({high})", "min_tokens")
    values = {k: v for k, v in card.default_sampling.items() if k in _SAMPLING_FIELDS and k != "max_tokens"}
    values["max_tokens"] = None
    values.update(overrides)
    if stops:
        values["stop"] = stops
    try:
        return SamplingParams(**values)
    except InvalidRequest as e:
        raise bad_request(str(e), e.param) from None


def include_usage(stream: bool, options: Any) -> bool:
    """A streamed response's usage chunk, as ``stream_options`` asks; options without streaming are refused (there
    is no stream for them to shape), as OpenAI's API does."""
    if options is None:
        return False
    if not stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    return bool(options.include_usage)


def with_seed_offset(sampling: SamplingParams, offset: int) -> SamplingParams:
    """Choice ``offset`` of n: a different (still reproducible) seed when the client gave one."""
    if sampling.seed is None or offset == 0:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + offset) % (MAX_SEED + 1))


async def build_choices(state: AppState, task: str, payload: dict[str, Any], sampling: SamplingParams,
                        params: dict[str, Any], n: int) -> list[RequestSpec]:
    """The ``n`` requests of one prompt's choices (``with_seed_offset``). The prompt is rendered and tokenized once:
    choices after the first are its request under a new id and seed. A request whose nodes sample their own way
    (``node_sampling``, derived from the request's sampling by its processor) is built again for each choice."""
    first = await state.build_request(task, payload, sampling, params)
    specs = [first]
    for i in range(1, n):
        choice = with_seed_offset(sampling, i)
        if first.node_sampling:
            specs.append(await state.build_request(task, payload, choice, params))
            continue
        fitted = first.sampling if choice.seed == first.sampling.seed else dataclasses.replace(first.sampling,
                                                                                                seed=choice.seed)
        specs.append(dataclasses.replace(first, inputs=dict(first.inputs), sampling=fitted, id=new_request_id(),
                                         arrival_time=time.time()))
    return specs


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


def apply_default_max_tokens(spec: RequestSpec, card: ModelCard, explicit: bool) -> None:
    """A request without an explicit max_tokens runs to the end of the context (the room the processor
    left, ``core/context.py``) unless the card has a default (the server's ``default_max_tokens``, else
    the model's), which then bounds it; a model without a known prompt length takes the default as it is."""
    default = card.default_sampling.get("max_tokens")
    if explicit or not isinstance(default, int) or isinstance(default, bool) or default < 1:
        return
    room = spec.sampling.max_tokens if prompt_length(spec) is not None else None
    spec.sampling = dataclasses.replace(spec.sampling, max_tokens=default if room is None else min(room, default))


def logprob_joiner(state, param: str) -> LogprobJoiner:
    """A joiner for a call that asked for logprobs; 400 when the served model cannot give them."""
    if "logprobs" not in state.card.capabilities:
        raise unsupported(param, f"logprobs for model {state.card.id!r}")
    return LogprobJoiner(state.processor.token_bytes)


def unsupported(param: str, what: str) -> ApiError:
    return bad_request(f"{what} is not supported by this server", param, "unsupported_parameter")
