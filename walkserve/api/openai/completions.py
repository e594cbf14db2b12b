"""/v1/completions: one request per (prompt, n); text chunks or one response."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from walkserve.api.openai.choices import (
    ChoiceTracker,
    PromptLogprobs,
    TokenLogprob,
    drive_choices,
    token_ids,
    usage,
)
from walkserve.api.openai.plan import (
    apply_default_max_tokens,
    build_choices,
    build_sampling,
    check_n,
    check_stops,
    include_usage,
    logprob_joiner,
    prompt_length,
    unsupported,
)
from walkserve.api.openai.text_plan import TextPlan
from walkserve.api.schemas.completions import CompletionRequest
from walkserve.api.sse import SSE_DONE, sse
from walkserve.api.state import AppState
from walkserve.api.text_stream import TextStream
from walkserve.core.errors import InvalidRequest

ROUTE = "/v1/completions"


def _prompts(prompt: Any) -> list[str | list[int]]:
    """str | [int] | [str] | [[int]] -> a list of single prompts."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [list(prompt)]
    return list(prompt)


def _shown_tokens(processor, skip_special_tokens: bool) -> Callable[[int], bool]:
    """Whether a token's text is in the choice's text: not a special token the detokenizer skips."""
    if not skip_special_tokens:
        return lambda token_id: True
    return functools.cache(lambda token_id: processor.decode([token_id]) != "")


def _reject_unsupported(body: CompletionRequest) -> None:
    if body.suffix:
        raise unsupported("suffix", "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise unsupported("best_of", "best_of other than n")


async def plan_completion(state: AppState, body: CompletionRequest) -> TextPlan:
    _reject_unsupported(body)
    prompts = _prompts(body.prompt)
    check_n(len(prompts) * body.n, state.config, "n")
    with_usage = include_usage(body.stream, body.stream_options)
    stops = body.stop_strings()
    check_stops(stops, state.config)
    overrides = body.sampling_overrides()
    if body.logprobs is not None:
        overrides["logprobs"] = body.logprobs
        if body.echo:
            overrides["prompt_logprobs"] = body.logprobs  # echo + logprobs: the prompt's too (one prefill)
    sampling = build_sampling(state.card, overrides, stops)
    specs, trackers, prefixes = [], [], []
    for p, prompt in enumerate(prompts):
        payload = {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
        echo = ""
        if body.echo:
            echo = prompt if isinstance(prompt, str) else state.processor.decode(prompt, body.skip_special_tokens)
        try:
            choices = await build_choices(state, "completion", payload, sampling, {}, body.n)
        except InvalidRequest as e:  # the processor's field for token ids, told as the client's: prompt
            if e.param in ("prompt", "prompt_token_ids"):
                e.param = "prompt" if len(prompts) == 1 else f"prompt[{p}]"
            raise
        for spec in choices:
            apply_default_max_tokens(spec, state.card, body.max_tokens is not None)
            text = TextStream(state.processor.detokenizer(body.skip_special_tokens), stops)
            specs.append(spec)
            joiner = logprob_joiner(state, "logprobs") if body.logprobs is not None else None
            prompt_lps = PromptLogprobs(joiner, prompt_ids(spec)) if joiner is not None and body.echo else None
            trackers.append(ChoiceTracker(len(trackers), text, prompt_length(spec), group=p, logprobs=joiner,
                                          prompt=prompt_lps))
            prefixes.append(echo)
    return TextPlan(body.model or state.card.id, specs, trackers, with_usage, prefixes=prefixes,
                    shows=_shown_tokens(state.processor, body.skip_special_tokens))


def _chunk(plan: TextPlan, choices: list[dict[str, Any]], usage_value: Any = None) -> dict[str, Any]:
    out = {
        "id": f"cmpl-{plan.id}",
        "object": "text_completion",
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if plan.include_usage:
        out["usage"] = usage_value
    return out


def _choice(index: int, text: str, finish_reason: str | None = None, logprobs: dict | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def _logprobs(entries: list[TokenLogprob], start: int, seen: bytearray, shows: Callable[[int], bool]) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object.

    ``text_offset`` is where each token's text starts in the choice's text:
    ``start`` (the echoed prompt) plus the characters completed by the tokens
    before it (``seen``, their bytes so far, which this extends); a token that
    continues a split character starts where that character does, and one the
    text does not show (``shows``: a skipped special token, e.g. the prompt's
    BOS) takes no room.
    """
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        out["tokens"].append(e.token)
        out["token_logprobs"].append(e.logprob)
        out["top_logprobs"].append(None if e.top is None else {text: lp for _, text, _, lp in e.top})
        out["text_offset"].append(start + len(seen.decode("utf-8", errors="ignore")))
        if shows(e.token_id):
            seen += e.bytes
    return out


def prompt_ids(spec) -> list[int]:
    return token_ids(spec.inputs["prompt_token_ids"])


def _merged(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return a or b
    return {key: a[key] + b[key] for key in a}


async def completion_stream(state: AppState, plan: TextPlan) -> AsyncIterator[bytes]:
    echoed: set[int] = set()
    seen = [bytearray() for _ in plan.prefixes]  # each choice's token bytes so far (for text_offset)
    updates = drive_choices(state.runner, plan.specs, plan.trackers, ROUTE)
    async with contextlib.aclosing(updates):
        async for update in updates:
            text = update.text
            if update.index not in echoed:
                echoed.add(update.index)
                text = plan.prefixes[update.index] + text
            logprobs = None
            if update.prompt_logprobs:  # the echoed prompt's tokens: offsets from 0
                logprobs = _logprobs(update.prompt_logprobs, 0, bytearray(), plan.shows)
            if update.logprobs:
                generated = _logprobs(update.logprobs, len(plan.prefixes[update.index]), seen[update.index], plan.shows)
                logprobs = _merged(logprobs, generated)
            if text or logprobs:
                yield sse(_chunk(plan, [_choice(update.index, text, logprobs=logprobs)]))
            if update.finish_reason:
                yield sse(_chunk(plan, [_choice(update.index, "", update.finish_reason)]))
    if plan.include_usage:
        yield sse(_chunk(plan, [], usage(plan.trackers)))
    yield SSE_DONE


async def completion_collect(state: AppState, plan: TextPlan) -> dict[str, Any]:
    texts: list[list[str]] = [[prefix] for prefix in plan.prefixes]
    entries: list[list[TokenLogprob]] = [[] for _ in plan.prefixes]
    prompts: list[list[TokenLogprob]] = [[] for _ in plan.prefixes]
    async with contextlib.aclosing(drive_choices(state.runner, plan.specs, plan.trackers, ROUTE)) as updates:
        async for update in updates:
            texts[update.index].append(update.text)
            entries[update.index] += update.logprobs or []
            prompts[update.index] += update.prompt_logprobs or []
    choices = []
    for t in plan.trackers:
        logprobs = None
        if t.joiner is not None:
            generated = _logprobs(entries[t.index], len(plan.prefixes[t.index]), bytearray(), plan.shows)
            prompt = _logprobs(prompts[t.index], 0, bytearray(), plan.shows) if t.prompt else None
            logprobs = _merged(prompt, generated)
        choices.append(_choice(t.index, "".join(texts[t.index]), t.finish_reason, logprobs))
    return {**_chunk(plan, choices), "usage": usage(plan.trackers)}
