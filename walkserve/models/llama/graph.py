"""The walks of a served causal LM (torch-free): fill the KV cache with the prompt, then decode.

    prefill:  input.prompt -> lm(tokens)                      (no outputs: it only fills the KV cache)
    decode:   input.last ─> DynamicLoop[ lm(tokens) -> token ]  carry lm.token -> lm.tokens
                               stop: token in stop_token_ids (not before min_tokens), at most max_tokens
              lm.token -> client:text
    decode_logprobs: the same loop, and each token's log-probabilities to the client
              lm.logprob, lm.top_logprobs, lm.top_logprob_ids -> client:logprobs
              (chosen instead of ``decode`` when the request's sampling asks for logprobs)
    prefill_logprobs: prefill that also returns the prompt's own log-probabilities (one prefill)
              input.prompt -> lm.tokens, input.targets (the prompt shifted by one) -> lm.targets
              lm.prompt_logprobs, lm.prompt_top_logprobs, lm.prompt_top_logprob_ids -> client:logprobs
              (chosen instead of ``prefill`` when the sampling asks for prompt_logprobs)

Every LM node declares its KV operation: append ``tokens`` to the request's
``main`` context (``walkserve.graph.kv``), so prefill (prompt minus its last
token) and decode (the last prompt token, then each sampled token) build one
history. A one-token prompt skips prefill. The
stop token itself is never exposed (not streamed, not fed to a consumer).
Orpheus reuses these pieces with its own decode walk (``models/orpheus/graph.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from walkserve.core.array import ArrayData
from walkserve.core.request import RequestSpec, Value
from walkserve.graph import (
    Client,
    DynamicLoop,
    GraphEdge,
    GraphNode,
    StateMachine,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.graph.kv import ALL, append, kv_params
from walkserve.graph.stop import max_tokens
from walkserve.models.common.text_walk import (
    LM,
    LOGPROB_OUTPUTS,
    PROMPT_INPUT,
    stop_rule,
)

PROMPT_LOGPROB_OUTPUTS = ("prompt_logprobs", "prompt_top_logprobs", "prompt_top_logprob_ids")
PROMPT_LOGPROBS_WALK = "prefill_logprobs"
CONTEXT = "main"
LOOP = "decode_loop"
LOGPROBS_WALK = "decode_logprobs"


def prefill_walk(logprobs: bool = False) -> Walk:
    """``input.prompt`` (every prompt token but the last) into the LM's KV cache.

    With ``logprobs`` (the ``prefill_logprobs`` walk) the same append returns,
    for every prompt row, the log-probability of the next prompt token
    (``input.targets``) and its top-k, in the same single prefill.
    """
    if not logprobs:
        node = GraphNode(LM, inputs=["tokens"], params=kv_params(append(CONTEXT)))
        return Walk("prefill", node, edges=[GraphEdge("input.prompt", f"{LM}.tokens")], inputs=["prompt"])
    node = GraphNode(LM, inputs=["tokens", "targets"], outputs=PROMPT_LOGPROB_OUTPUTS,
                     params=kv_params(append(CONTEXT, rows=ALL)))
    edges = [GraphEdge("input.prompt", f"{LM}.tokens"), GraphEdge("input.targets", f"{LM}.targets")]
    edges += [GraphEdge(f"{LM}.{out}", Client("logprobs")) for out in PROMPT_LOGPROB_OUTPUTS]
    return Walk(PROMPT_LOGPROBS_WALK, node, edges=edges, inputs=["prompt", "targets"])


def decode_loop(node_params: Mapping[str, Any] | None = None, always_stop: tuple[int, ...] = (),
                extra_outputs: tuple[str, ...] = ()) -> DynamicLoop:
    """The sampling loop: one token per iteration, fed back as the next iteration's input."""
    params = {**dict(node_params or {}), **kv_params(append(CONTEXT))}
    node = GraphNode(LM, inputs=["tokens"], outputs=["token", *extra_outputs], params=params)
    return DynamicLoop(node, stop=stop_rule(always_stop), max_iterations=max_tokens,
                       carry={f"{LM}.token": f"{LM}.tokens"}, name=LOOP)


def text_decode_walk(logprobs: bool = False) -> Walk:
    """``decode``; with ``logprobs``, ``decode_logprobs``, which also sends each token's logprob and top-k."""
    extra = LOGPROB_OUTPUTS if logprobs else ()
    edges = [GraphEdge("input.last", f"{LM}.tokens"), GraphEdge(f"{LM}.token", Client("text"))]
    edges += [GraphEdge(f"{LM}.{out}", Client("logprobs")) for out in extra]
    return Walk(LOGPROBS_WALK if logprobs else "decode", decode_loop(extra_outputs=extra), edges=edges, inputs=["last"])


def prompt_ids(request: RequestSpec) -> list[int]:
    """The request's prompt token ids; ValueError (the request fails) when missing or empty."""
    value = request.inputs.get(PROMPT_INPUT)
    ids = value.tolist() if isinstance(value, ArrayData) else value
    if not isinstance(ids, list) or not ids:
        raise ValueError(f"request {request.id}: inputs[{PROMPT_INPUT!r}] must be a non-empty list of token ids")
    return [int(t) for t in ids]


class PromptThenDecode(StateMachine):
    """prefill (when the prompt has more than one token), then decode, then done.

    With ``logprobs`` set, a request whose sampling asks for logprobs decodes
    through the ``decode_logprobs`` walk instead, and one that asks for
    prompt_logprobs prefills through ``prefill_logprobs``.
    """

    def __init__(self, logprobs: bool = False):
        self.logprobs = logprobs

    def _decode(self, request: RequestSpec) -> str:
        return LOGPROBS_WALK if self.logprobs and request.sampling.logprobs is not None else "decode"

    def first(self, request: RequestSpec) -> WalkStart:
        ids = prompt_ids(request)
        if len(ids) == 1:
            return WalkStart(self._decode(request), {"last": ArrayData.from_list(ids, "int64")})
        prompt = ArrayData.from_list(ids[:-1], "int64")
        if self.logprobs and request.sampling.prompt_logprobs is not None:
            return WalkStart(PROMPT_LOGPROBS_WALK, {"prompt": prompt, "targets": ArrayData.from_list(ids[1:], "int64")})
        return WalkStart("prefill", {"prompt": prompt})

    def next(self, request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
        if finished in ("prefill", PROMPT_LOGPROBS_WALK):
            return WalkStart(self._decode(request), {"last": ArrayData.from_list(prompt_ids(request)[-1:], "int64")})
        return None


def prompt_state_machine(logprobs: bool = False) -> PromptThenDecode:
    """prefill, then decode (``decode_logprobs`` for requests asking for logprobs, when ``logprobs``)."""
    return PromptThenDecode(logprobs)


def build_graph(name: str = "llama") -> WalkGraph:
    """The text LM's walk graph (prefill + decode, text and, when asked for, logprobs to the client)."""
    walks = [prefill_walk(), prefill_walk(logprobs=True), text_decode_walk(), text_decode_walk(logprobs=True)]
    return WalkGraph(name, walks, prompt_state_machine(True))
