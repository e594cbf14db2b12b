"""A request without max_tokens runs to a stop condition or to the end of the context (the room left);
an explicit max_tokens that does not fit is a 400. Through the real HTTP server on a tiny Qwen3 with a
96-token context, with the official ``openai`` client and with plain bodies."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.api.real_server import in_thread_server
from walkserve.core.config import RuntimeConfig
from walkserve.models.llama.tiny import write_tiny

pytestmark = pytest.mark.slow
CONTEXT = 96
MESSAGES = [{"role": "user", "content": "Tell me about rivers."}]
RUNS_TO_THE_END = {"ignore_eos": True, "temperature": 0}  # no stop token: only the context can end it


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny("qwen3", tmp_path_factory.mktemp("ctx") / "tiny-qwen3", max_position_embeddings=CONTEXT, seed=5)
    with in_thread_server("qwen3", path, RuntimeConfig(max_running=4)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_chat_without_max_tokens_runs_to_the_end_of_the_context(client):
    answer = client.chat.completions.create(model="tiny-qwen3", messages=MESSAGES, extra_body=RUNS_TO_THE_END)
    usage = answer.usage
    assert answer.choices[0].finish_reason == "length"
    assert usage.prompt_tokens + usage.completion_tokens == CONTEXT
    plain = client.chat.completions.create(model="tiny-qwen3", messages=MESSAGES)  # what most clients send
    assert plain.choices[0].finish_reason in ("stop", "length")
    assert plain.usage.prompt_tokens + plain.usage.completion_tokens <= CONTEXT


def test_openai_completion_without_max_tokens_runs_to_the_end_of_the_context(client):
    answer = client.completions.create(model="tiny-qwen3", prompt="The river flows", extra_body=RUNS_TO_THE_END)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.prompt_tokens + answer.usage.completion_tokens == CONTEXT


@pytest.mark.parametrize("route, body", [("/v1/chat/completions", {"messages": MESSAGES}),
                                         ("/v1/completions", {"prompt": "The river flows"})])
def test_a_plain_body_without_max_tokens_is_served(server, route, body):
    # seeded (no max_tokens is the point): unseeded, the random LM's first token is its stop token for about one
    # seed in 150 (seed 95 of 0-149, on both routes), an answer of no tokens
    response = httpx.post(f"{server.url}{route}", json={**body, "seed": 7}, timeout=60)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["completion_tokens"] >= 1 and usage["prompt_tokens"] + usage["completion_tokens"] <= CONTEXT
    streamed = httpx.post(f"{server.url}{route}", json={**body, "stream": True, **RUNS_TO_THE_END}, timeout=60)
    assert streamed.status_code == 200 and '"finish_reason":"length"' in streamed.text.replace(" ", "")


def test_an_explicit_max_tokens_that_does_not_fit_is_a_400(client):
    prompt = client.completions.create(model="tiny-qwen3", prompt="The river flows", max_tokens=1).usage.prompt_tokens
    fits = client.completions.create(model="tiny-qwen3", prompt="The river flows", max_tokens=CONTEXT - prompt,
                                     extra_body=RUNS_TO_THE_END)
    assert fits.usage.completion_tokens == CONTEXT - prompt
    for create in (lambda n: client.completions.create(model="tiny-qwen3", prompt="The river flows", max_tokens=n),
                   lambda n: client.chat.completions.create(model="tiny-qwen3", messages=MESSAGES, max_tokens=n)):
        with pytest.raises(openai.BadRequestError) as err:
            create(CONTEXT)
        assert err.value.body["param"] == "max_tokens" and err.value.body["code"] == "context_length_exceeded"


def test_a_prompt_that_fills_the_context_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny-qwen3", prompt=[1] * CONTEXT)
    assert err.value.body["param"] == "prompt" and err.value.body["code"] == "context_length_exceeded"


def test_native_generate_without_max_tokens_runs_to_the_end(server):
    body = {"inputs": {"prompt": "The river flows"}, "sampling": RUNS_TO_THE_END, "stream": False}
    response = httpx.post(f"{server.url}/v1/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["finish_reason"] == "length" and sum(1 for o in out["outputs"] if o["modality"] == "text") > 16
