"""Context fit: how many tokens a request may generate. One policy, used by every processor (and so by
every API route), by the API's defaults and by the KV engine's admission (stdlib only).

A context of C positions holds the prompt (P tokens) and what is generated from it:

    P < C                  the prompt leaves room for at least one token, else an error on the prompt
                           (a floor on P known before tokenizing is enough to refuse it: ``check_prompt_floor``)
    P + max_tokens <= C    an explicit max_tokens must fit, else an error on max_tokens (HTTP 400)
    max_tokens = C - P     when none is given: the request runs to a stop condition or to the end
                           of the context (the room left)

The KV engine holds the KV of every token it was fed (the prompt and every generated token but the
last), so a request that fits the model's context fits any pool of at least C tokens; a context that
outgrows its pool fails with the same arithmetic (``context_fits``).
"""

from __future__ import annotations

from walkserve.core.errors import InvalidRequest

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # the error code OpenAI's API uses


def context_fits(tokens: int, positions: int) -> bool:
    """Whether ``tokens`` tokens fit a context (or a KV pool) of ``positions`` positions."""
    return tokens <= positions


def max_new_tokens(prompt_tokens: int, context: int, max_tokens: int | None, prompt_param: str = "prompt",
                   what: str = "the model's context") -> int:
    """The max_tokens a request of ``prompt_tokens`` runs with in a context of ``context`` positions.

    ``max_tokens`` None means "as many as fit": the room left. InvalidRequest names ``prompt_param``
    when the prompt fills the context, ``max_tokens`` when an explicit value does not fit; ``what`` is
    what the messages call the bound (``Processor.served_context``).
    """
    if not context_fits(prompt_tokens + 1, context):
        raise InvalidRequest(f"the prompt has {prompt_tokens} tokens; {what} is {context}",
                             param=prompt_param, code=CONTEXT_LENGTH_EXCEEDED)
    room = context - prompt_tokens
    if max_tokens is None:
        return room
    if not context_fits(prompt_tokens + max_tokens, context):
        raise InvalidRequest(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds {what} of "
            f"{context} tokens; at most {room} tokens can be generated",
            param="max_tokens", code=CONTEXT_LENGTH_EXCEEDED,
        )
    return max_tokens


def check_prompt_floor(min_tokens: int, context: int, prompt_param: str = "prompt", what: str = "the model's context",
                       why: str = "") -> None:
    """Refuses a prompt known, without tokenizing it, to have at least ``min_tokens`` tokens, when even that
    many leave no room in ``context``: the error ``max_new_tokens`` would give once it is tokenized (``why``
    says how the floor was found)."""
    if not context_fits(min_tokens + 1, context):
        raise InvalidRequest(f"the prompt has at least {min_tokens} tokens{why}; {what} is {context}",
                             param=prompt_param, code=CONTEXT_LENGTH_EXCEEDED)
