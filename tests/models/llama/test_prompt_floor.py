"""A prompt whose length alone shows it cannot fit the served context is refused before it is tokenized, with
the error a tokenized one gets; one at the edge of the floor is still served."""

from __future__ import annotations

import pytest

from walkserve.core.errors import InvalidRequest
from walkserve.core.sampling import SamplingParams
from walkserve.models.llama.processor import TextLMProcessor

HEADER = "<|start_header_id|>"  # the tiny Llama tokenizer's longest token: one token per 19 characters
CONTEXT = 1024


@pytest.fixture
def llama(tiny_dirs):
    return TextLMProcessor(tiny_dirs["llama"])


@pytest.fixture
def untokenized(llama, monkeypatch):
    """The processor, failing the test if it tokenizes anything."""
    monkeypatch.setattr(llama.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    return llama


def build(processor, task, payload, max_tokens=None):
    return processor.build_request(task, payload, SamplingParams(max_tokens=max_tokens), processor.check_params({}))


def refused(call) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        call()
    assert err.value.code == "context_length_exceeded"
    return err.value


def test_a_huge_completion_is_refused_untokenized_on_check_and_on_build(untokenized):
    prompt = "The river flows. " * 600_000  # 10 MB
    for call in (lambda: untokenized.check_prompt_size("completion", {"prompt": prompt}),
                 lambda: build(untokenized, "completion", {"prompt": prompt})):
        error = refused(call)
        assert error.param == "prompt"
        assert str(error) == (f"the prompt has at least {len(prompt) // 19 + 1} tokens ({len(prompt)} characters, at "
                              f"most 19 per token); the model's context is {CONTEXT}")
    generate = {"inputs": {"prompt": prompt}, "modalities": ["text"]}
    assert refused(lambda: untokenized.check_prompt_size("generate", generate)).param == "inputs"
    ids = {"prompt_token_ids": [1] * 2 * CONTEXT}
    assert str(refused(lambda: untokenized.check_prompt_size("completion", ids))) == (
        f"the prompt has {2 * CONTEXT} tokens; the model's context is {CONTEXT}")


def test_a_huge_chat_is_refused_after_rendering_before_tokenizing(untokenized):
    messages = [{"role": "user", "content": "The river flows. " * 600_000}]
    untokenized.check_prompt_size("chat", {"messages": messages})  # a template must render it first
    assert refused(lambda: build(untokenized, "chat", {"messages": messages})).param == "messages"


def test_the_floor_reads_the_rendered_chat_not_the_messages(llama):
    # the Llama 3 template trims each message: 100 000 spaces render to nothing
    spec = build(llama, "chat", {"messages": [{"role": "user", "content": " " * 100_000 + "hi"}]})
    assert spec.inputs["prompt_token_ids"].numel < 30


def test_a_prompt_at_the_floor_edge_is_served(llama):
    # n copies of the longest token are exactly n tokens (+ BOS): the floor is tight here and still lets it in
    spec = build(llama, "completion", {"prompt": HEADER * (CONTEXT - 2)}, max_tokens=1)
    assert spec.inputs["prompt_token_ids"].numel == CONTEXT - 1 and spec.sampling.max_tokens == 1
    past = refused(lambda: build(llama, "completion", {"prompt": HEADER * (CONTEXT - 1)}))  # passes the floor
    assert str(past) == f"the prompt has {CONTEXT} tokens; the model's context is {CONTEXT}"  # the count refuses it
    assert "at least" in str(refused(lambda: build(llama, "completion", {"prompt": HEADER * CONTEXT})))


def test_the_floor_is_held_to_the_served_context(untokenized):
    untokenized.kv_tokens = 64  # a KV pool of 64 tokens
    error = refused(lambda: untokenized.check_prompt_size("completion", {"prompt": "x" * 19 * 64}))
    assert str(error).endswith("the served context (what the KV pool holds) is 64")
    untokenized.check_prompt_size("completion", {"prompt": "x" * 19 * 63})
