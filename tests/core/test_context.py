"""The one context-fit policy: explicit max_tokens must fit, none takes the room left."""

from __future__ import annotations

import pytest

from walkserve.core.context import CONTEXT_LENGTH_EXCEEDED, context_fits, max_new_tokens
from walkserve.core.errors import InvalidRequest


def test_without_max_tokens_a_request_gets_the_room_left():
    assert max_new_tokens(16, 1024, None) == 1008
    assert max_new_tokens(1023, 1024, None) == 1


def test_an_explicit_max_tokens_is_kept_when_it_fits_and_refused_when_not():
    assert max_new_tokens(16, 1024, 1008) == 1008
    with pytest.raises(InvalidRequest) as err:
        max_new_tokens(16, 1024, 1009)
    assert (err.value.param, err.value.code) == ("max_tokens", CONTEXT_LENGTH_EXCEEDED)
    assert "prompt (16 tokens) + max_tokens (1009)" in str(err.value) and "at most 1008" in str(err.value)


@pytest.mark.parametrize("prompt", [1024, 2000])
def test_a_prompt_that_leaves_no_room_is_refused_on_the_prompt(prompt):
    with pytest.raises(InvalidRequest) as err:
        max_new_tokens(prompt, 1024, None, prompt_param="messages")
    assert (err.value.param, err.value.code) == ("messages", CONTEXT_LENGTH_EXCEEDED)


def test_what_the_model_context_admits_fits_a_pool_of_that_many_positions():
    """The engine holds prompt + max_tokens - 1 tokens at most (the last sampled one is never fed)."""
    for prompt in (1, 10, 1023):
        generated = max_new_tokens(prompt, 1024, None)
        assert context_fits(prompt + generated - 1, 1024) and not context_fits(1025, 1024)
