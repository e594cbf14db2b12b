"""/v1/generate: plan one request, then NDJSON events (or one JSON document) for every output."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from walkserve.api.errors import bad_request
from walkserve.api.native.inputs import convert_inputs
from walkserve.api.native.render import (
    event_head,
    plain,
    raw_array,
    render_action,
    render_audio,
    render_image,
)
from walkserve.api.openai.choices import failure, token_ids
from walkserve.api.openai.plan import apply_default_max_tokens, build_sampling, check_stops
from walkserve.api.schemas.generate import GenerateRequest
from walkserve.api.sse import ndjson
from walkserve.api.state import AppState
from walkserve.api.text_stream import TextStream
from walkserve.core.array import ArrayData
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.core.request import RequestSpec

ROUTE = "/v1/generate"


@dataclass
class NativePlan:
    spec: RequestSpec
    body: GenerateRequest
    text: TextStream | None
    t0: float


TASK_CAPABILITY = {"generate": "generate", "completion": "completions", "chat": "chat", "speech": "speech", "image": "images",
                   "act": "act", "encode": "encode", "predict": "predict", "rollout": "rollout", "plan": "plan"}
RAW_INPUT_TASKS = ("generate", "act", "encode", "predict", "rollout", "plan")  # their processors read the payload's "inputs" as given


async def plan_generate(state: AppState, body: GenerateRequest) -> NativePlan:
    state.require(TASK_CAPABILITY[body.task], f"task {body.task!r} on the native route", "task")
    sampling_fields = body.sampling
    stops = sampling_fields.stop_strings() if sampling_fields else ()
    check_stops(stops, state.config)
    overrides = sampling_fields.sampling_overrides() if sampling_fields else {}
    if sampling_fields and sampling_fields.logprobs is not None:
        state.require("logprobs", "sampling.logprobs", "sampling.logprobs")
        overrides["logprobs"] = sampling_fields.logprobs
    sampling = build_sampling(state.card, overrides, stops)
    inputs = await convert_inputs(state, body.inputs)
    modalities = body.modalities or (["action"] if body.task == "act" else ["text"])
    payload = {"inputs": inputs, "modalities": modalities} if body.task in RAW_INPUT_TASKS else {**inputs, "modalities": modalities}
    spec = await state.build_request(body.task, payload, sampling, dict(body.params))
    apply_default_max_tokens(spec, state.card, bool(sampling_fields and sampling_fields.max_tokens))
    return NativePlan(spec, body, _text_stream(state, stops, sampling_fields), time.monotonic())


def _text_stream(state: AppState, stops: tuple[str, ...], fields) -> TextStream | None:
    try:
        detok = state.processor.detokenizer(fields.skip_special_tokens if fields else True)
    except NotImplementedError:
        if stops:
            raise bad_request("this model has no tokenizer, so stop strings cannot be matched", "sampling.stop") from None
        return None
    return TextStream(detok, stops)


async def _render(state: AppState, plan: NativePlan, event: OutputEvent) -> dict[str, Any]:
    value = event.data
    if event.modality == "text":
        ids = token_ids(value)
        text = plan.text.push(ids) if plan.text is not None else None
        data: Any = {"token_ids": ids, "text": text}
    elif not isinstance(value, ArrayData):
        data = {"value": plain(value)}
    elif event.modality == "audio":
        data = render_audio(value, plan.body.audio_encoding, state.card.sample_rate)
    elif event.modality == "image":
        data = await render_image(value, plan.body.image_format)
    elif event.modality == "logprobs":
        data = {"values": plain(value.tolist())}
    elif event.modality == "action":
        data = render_action(value)
    else:
        data = raw_array(value)
    return {**event_head(event), "data": data}


def _final(plan: NativePlan, finished: RequestFinished | None, reason: str) -> dict[str, Any]:
    timings = dict(finished.timings) if finished else {}
    timings["api_total"] = time.monotonic() - plan.t0
    tail = plan.text.flush() if plan.text is not None and reason != "stop_string" else ""
    return {
        "type": "finished",
        "request_id": plan.spec.id,
        "finish_reason": "stop" if reason == "stop_string" else reason,
        "text": tail,
        "usage": plain(dict(finished.usage)) if finished else {},
        "timings": plain(timings),
    }


async def native_events(state: AppState, plan: NativePlan) -> AsyncIterator[dict[str, Any]]:
    """Rendered output events, then the final event; a stop string ends the request (as finished)."""
    async with contextlib.aclosing(state.runner.events(plan.spec, ROUTE)) as events:
        async for event in events:
            if isinstance(event, RequestFinished):
                if event.reason in (FinishReason.ERROR, FinishReason.ABORT):
                    raise failure(event)
                yield _final(plan, event, str(event.reason))
                return
            if event.modality == "latent" and "audio" in plan.spec.modalities and not plan.body.params.get(
                    "codec_frames"):
                continue  # a spoken answer's codec frames go out only when asked (params.codec_frames)
            yield await _render(state, plan, event)
            if plan.text is not None and plan.text.stopped:
                await state.runner.stop(plan.spec)
                yield _final(plan, None, "stop_string")
                return


async def generate_stream(state: AppState, plan: NativePlan) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(native_events(state, plan)) as events:
        async for item in events:
            yield ndjson(item)


async def generate_collect(state: AppState, plan: NativePlan) -> dict[str, Any]:
    outputs = [item async for item in native_events(state, plan)]
    final = outputs.pop() if outputs and outputs[-1]["type"] == "finished" else _final(plan, None, "error")
    answer = {"request_id": plan.spec.id, "outputs": outputs, **{k: final[k] for k in ("finish_reason", "text", "usage", "timings")}}
    chunks = [o["data"]["actions"] for o in outputs if o.get("modality") == "action"]
    if chunks:  # a policy's answer: its (last) action chunk [H, action_dim], at the top
        answer["actions"] = chunks[-1]
    return answer
