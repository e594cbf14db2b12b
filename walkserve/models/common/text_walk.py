"""Pieces of a causal LM's walks that several families build on (torch-free).

The node name, the prompt input key, the decode loop's log-probability
outputs and its stop rule: Llama's walks (``models/llama/graph.py``) are made
of them, and Qwen3-Omni's thinker and BAGEL's text decode use the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from walkserve.core.params import RequestParams
from walkserve.graph import StopWhen
from walkserve.graph.stop import scalar

LM = "lm"
PROMPT_INPUT = "prompt_token_ids"  # RequestSpec.inputs key: int64 [N] (the key the API reads prompt lengths from)
LOGPROB_OUTPUTS = ("logprob", "top_logprobs", "top_logprob_ids")


@dataclass(frozen=True)
class StopTokens:
    """Stop predicate: the token is in the request's ``stop_token_ids`` and ``min_tokens`` were generated.

    Iteration k of the decode loop samples generated token k (from 0), so a
    stop token may end the loop from iteration ``min_tokens`` on. ``always``
    ids stop at any iteration (a token that must never reach a consumer).
    """

    always: tuple[int, ...] = ()

    def __call__(self, value: Any, params: RequestParams, iteration: int) -> bool:
        token = scalar(value)
        if token in self.always:
            return True
        return token in params.sampling.stop_token_ids and iteration >= params.sampling.min_tokens


def stop_rule(always: tuple[int, ...] = ()) -> StopWhen:
    """The decode loop's stop rule on ``lm.token``; the stopping token is not exposed."""
    label = "stop_token_ids after min_tokens"
    if always:
        label = f"{' or '.join(map(str, always))} or {label}"
    return StopWhen(f"{LM}.token", StopTokens(tuple(always)), include_stopping=False, label=label)
