"""A KV pool that holds fewer tokens than the model's context bounds the served context: requests are fitted
to it (an answer without max_tokens ends with "length" where the pool is full) or refused with a 400
before they start, never failed halfway. Through the real HTTP server on a tiny Qwen3 (a 256-token
context) whose pool holds 5 blocks of 16 tokens."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.api.real_server import in_thread_server
from tests.polling import wait_for
from walkserve.core.config import RuntimeConfig
from walkserve.models.llama.tiny import write_tiny

pytestmark = pytest.mark.slow
CONTEXT, POOL = 256, 5 * 16
RUNS_TO_THE_END = {"ignore_eos": True, "temperature": 0}  # no stop token: only the context can end it


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny("qwen3", tmp_path_factory.mktemp("pool") / "tiny-qwen3", max_position_embeddings=CONTEXT, seed=5)
    runtime = RuntimeConfig(max_running=4, engine_options={"kv": {"num_blocks": 5, "block_size": 16}})
    with in_thread_server("qwen3", path, runtime) as s:
        # the workers' first report (every half second) tells the frontend what the pool holds
        assert wait_for(lambda: any("kv_tokens_total" in e for e in s.engine.stats().engine_ranks.values()), 10)
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_the_model_card_says_the_served_context(client):
    [model] = client.models.list().data
    assert model.model_extra["max_context"] == POOL


def test_an_answer_without_max_tokens_ends_where_the_pool_is_full(client):
    answer = client.completions.create(model="tiny-qwen3", prompt="The river flows", extra_body=RUNS_TO_THE_END)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.prompt_tokens + answer.usage.completion_tokens == POOL
    chat = client.chat.completions.create(model="tiny-qwen3", messages=[{"role": "user", "content": "Rivers?"}],
                                          extra_body=RUNS_TO_THE_END, stream=True, stream_options={"include_usage": True})
    chunks = list(chat)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.prompt_tokens + chunks[-1].usage.completion_tokens == POOL


def test_what_the_pool_cannot_hold_is_a_400_before_it_starts(server, client):
    with pytest.raises(openai.BadRequestError) as long_prompt:  # fits the model's context, not the pool
        client.completions.create(model="tiny-qwen3", prompt=list(range(100, 100 + POOL + 20)), max_tokens=1)
    error = long_prompt.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt" and "KV pool" in error["message"]
    with pytest.raises(openai.BadRequestError) as too_many:
        client.completions.create(model="tiny-qwen3", prompt="The river flows", max_tokens=POOL)
    assert too_many.value.body["param"] == "max_tokens" and f"of {POOL} tokens" in too_many.value.body["message"]
    health = httpx.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 200
