"""The walks of a served causal LM (torch-free): fill the KV cache with the prompt, then decode.

    prefill:  input.prompt -> lm(tokens)                      (no outputs: it only fills the KV cache)
    decode:   input.last ─> DynamicLoop[ lm(tokens) -> token ]  carry lm.token -> lm.tokens
                               stop: token in stop_token_ids (not before min_tokens), at most max_tokens
              lm.token -> client:text

The KV engine appends each firing's ``tokens`` to the request's context, so
prefill (prompt minus its last token) and decode (the last prompt token, then
each sampled token) build one history. A one-token prompt skips prefill. The
stop token itself is never exposed (not streamed, not fed to a consumer).
Orpheus reuses these pieces with its own decode walk (``models/orpheus/graph.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from walkserve.core.array import ArrayData
from walkserve.core.request import RequestSpec, Value
from walkserve.graph import (
    Client,
    DynamicLoop,
    FunctionStateMachine,
    GraphEdge,
    GraphNode,
    StopWhen,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.graph.stop import scalar

PROMPT_INPUT = "prompt_token_ids"  # RequestSpec.inputs key: int64 [N] (the key the API reads prompt lengths from)
LM = "lm"
LOOP = "decode_loop"


@dataclass(frozen=True)
class StopTokens:
    """Stop predicate: the token is in the request's ``stop_token_ids`` and ``min_tokens`` were generated.

    Iteration k of the decode loop samples generated token k (from 0), so a
    stop token may end the loop from iteration ``min_tokens`` on. ``always``
    ids stop at any iteration (a token that must never reach a consumer).
    """

    always: tuple[int, ...] = ()

    def __call__(self, value: Any, params: Mapping[str, Any], iteration: int) -> bool:
        token = scalar(value)
        if token in self.always:
            return True
        return token in (params.get("stop_token_ids") or ()) and iteration >= int(params.get("min_tokens") or 0)


def stop_rule(always: tuple[int, ...] = ()) -> StopWhen:
    """The decode loop's stop rule on ``lm.token``; the stopping token is not exposed."""
    label = "stop_token_ids after min_tokens"
    if always:
        label = f"{' or '.join(map(str, always))} or {label}"
    return StopWhen(f"{LM}.token", StopTokens(tuple(always)), include_stopping=False, label=label)


def prefill_walk() -> Walk:
    """``input.prompt`` (every prompt token but the last) into the LM's KV cache."""
    return Walk("prefill", GraphNode(LM, inputs=["tokens"]), edges=[GraphEdge("input.prompt", f"{LM}.tokens")],
                inputs=["prompt"])


def decode_loop(node_params: Mapping[str, Any] | None = None, always_stop: tuple[int, ...] = ()) -> DynamicLoop:
    """The sampling loop: one token per iteration, fed back as the next iteration's input."""
    node = GraphNode(LM, inputs=["tokens"], outputs=["token"], params=dict(node_params or {}))
    return DynamicLoop(node, stop=stop_rule(always_stop), max_iterations="max_tokens",
                       carry={f"{LM}.token": f"{LM}.tokens"}, name=LOOP)


def text_decode_walk() -> Walk:
    return Walk("decode", decode_loop(), edges=[GraphEdge("input.last", f"{LM}.tokens"),
                                                 GraphEdge(f"{LM}.token", Client("text"))], inputs=["last"])


def prompt_ids(request: RequestSpec) -> list[int]:
    """The request's prompt token ids; ValueError (the request fails) when missing or empty."""
    value = request.inputs.get(PROMPT_INPUT)
    ids = value.tolist() if isinstance(value, ArrayData) else value
    if not isinstance(ids, list) or not ids:
        raise ValueError(f"request {request.id}: inputs[{PROMPT_INPUT!r}] must be a non-empty list of token ids")
    return [int(t) for t in ids]


def _first(request: RequestSpec) -> WalkStart:
    ids = prompt_ids(request)
    if len(ids) == 1:
        return WalkStart("decode", {"last": ArrayData.from_list(ids, "int64")})
    return WalkStart("prefill", {"prompt": ArrayData.from_list(ids[:-1], "int64")})


def _next(request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
    if finished == "prefill":
        return WalkStart("decode", {"last": ArrayData.from_list(prompt_ids(request)[-1:], "int64")})
    return None


def prompt_state_machine() -> FunctionStateMachine:
    """prefill (when the prompt has more than one token), then decode, then done."""
    return FunctionStateMachine(_first, _next)


def build_graph(name: str = "llama") -> WalkGraph:
    """The text LM's walk graph (prefill + decode, text to the client)."""
    return WalkGraph(name, [prefill_walk(), text_decode_walk()], prompt_state_machine())
