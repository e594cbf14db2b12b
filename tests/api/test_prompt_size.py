"""A prompt too long for the context is refused at once, before it is tokenized; a long prompt that is
being built does not hold up small requests (processor lanes); a client gone while its request waits for a
lane drops it. On the fake model: a token per UTF-8 byte, so n characters are at least n tokens."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from walkserve.api.processor_lanes import BIG_INPUT, ProcessorLanes, input_size
from walkserve.core.array import ArrayData
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

from .helpers import asgi_client, assert_envelope, live_server

CONTEXT = 64


class HeldBuilds:
    """Holds every build of a big payload until released; counts the builds that ran."""

    def __init__(self, engine: FakeEngine, monkeypatch):
        self.started, self.release, self.prompts = threading.Event(), threading.Event(), []
        build = engine.processor.build_request

        def held(task, payload, sampling, params):
            prompt = payload.get("prompt") or payload.get("inputs", {}).get("prompt", "")  # /v1/generate: its inputs
            self.prompts.append(prompt[:8])
            if len(prompt) > BIG_INPUT:
                self.started.set()
                assert self.release.wait(20), "never released"
            return build(task, payload, sampling, params)

        monkeypatch.setattr(engine.processor, "build_request", held)


def big_engine() -> FakeEngine:
    return FakeEngine(FakeEngineConfig(token_delay_s=0.0, max_context=10 * BIG_INPUT))


async def test_a_huge_prompt_is_refused_at_once_with_the_context_error():
    engine = FakeEngine(FakeEngineConfig(token_delay_s=0.0, max_context=CONTEXT))
    async with asgi_client(engine) as client:
        start = time.monotonic()
        response = await client.post("/v1/completions", json={"prompt": "x" * 10_000_000, "max_tokens": 1})
        assert time.monotonic() - start < 5  # tokenized, it took seconds; refused by its length, milliseconds
        error = assert_envelope(response, 400, "prompt", "context_length_exceeded")
        assert error["message"] == ("the prompt has at least 10000000 tokens (10000000 characters, at most 1 per "
                                    f"token); the model's context is {CONTEXT}")
        listed = await client.post("/v1/completions", json={"prompt": ["hi", "x" * CONTEXT], "max_tokens": 1})
        assert_envelope(listed, 400, "prompt[1]", "context_length_exceeded")


async def test_a_prompt_at_the_edge_of_the_context_is_served():
    engine = FakeEngine(FakeEngineConfig(token_delay_s=0.0, max_context=CONTEXT))
    async with asgi_client(engine) as client:
        fits = await client.post("/v1/completions", json={"prompt": "x" * (CONTEXT - 1), "max_tokens": 1})
        assert fits.status_code == 200, fits.text
        assert fits.json()["usage"]["prompt_tokens"] == CONTEXT - 1
        over = await client.post("/v1/completions", json={"prompt": "x" * CONTEXT, "max_tokens": 1})
        assert_envelope(over, 400, "prompt", "context_length_exceeded")


async def test_a_small_request_is_answered_while_a_big_one_is_being_built(monkeypatch):
    engine = big_engine()
    held = HeldBuilds(engine, monkeypatch)
    async with asgi_client(engine) as client:
        big = asyncio.create_task(client.post("/v1/completions", json={"prompt": "x" * 2 * BIG_INPUT, "max_tokens": 1}))
        assert await asyncio.to_thread(held.started.wait, 10)
        small = await asyncio.wait_for(client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}), 10)
        assert small.status_code == 200 and not big.done()  # answered while the big one is still held
        held.release.set()
        assert (await big).status_code == 200


def _completion(prompt: str) -> tuple[str, dict]:
    return "/v1/completions", {"prompt": prompt, "max_tokens": 1}


def _generate(prompt: str) -> tuple[str, dict]:
    return "/v1/generate", {"inputs": {"prompt": prompt}, "sampling": {"max_tokens": 1}}


@pytest.mark.parametrize("body", [_completion, _generate], ids=["completions", "generate"])
def test_a_client_gone_while_its_big_request_waits_drops_it(monkeypatch, body):
    engine = big_engine()
    held = HeldBuilds(engine, monkeypatch)
    with live_server(engine) as url:
        route, first_body = body("a" * 2 * BIG_INPUT)
        first = threading.Thread(target=httpx.post, args=(f"{url}{route}",), kwargs={"json": first_body, "timeout": 30})
        first.start()
        assert held.started.wait(10)  # the big lane is busy: the next big request waits for it
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}{route}", json=body("b" * 2 * BIG_INPUT)[1], timeout=0.5)
        time.sleep(0.5)  # the server hears of the disconnect
        held.release.set()
        first.join(10)
        ok = httpx.post(f"{url}{route}", json=body("c" * 2 * BIG_INPUT)[1], timeout=10)
        assert ok.status_code == 200, ok.text
    assert held.prompts == ["a" * 8, "c" * 8]  # the gone client's prompt was never built


async def test_each_lane_keeps_its_order():
    lanes, order = ProcessorLanes(big_input=4), []
    gate = threading.Event()

    def job(name, wait=False):
        if wait:
            assert gate.wait(10)
        order.append(name)
        return name

    big = [asyncio.ensure_future(lanes.run({"prompt": "long text"}, lambda n=n: job(n, n == "big0"))) for n in ("big0", "big1")]
    small = [asyncio.ensure_future(lanes.run({"prompt": "hi"}, lambda n=n: job(n))) for n in ("small0", "small1")]
    assert await asyncio.gather(*small) == ["small0", "small1"]
    gate.set()
    assert await asyncio.gather(*big) == ["big0", "big1"]
    assert order == ["small0", "small1", "big0", "big1"]


def test_input_size_counts_text_ids_and_media_up_to_the_limit():
    assert input_size({"prompt": "abc"}, 100) == 3
    assert input_size({"prompt_token_ids": list(range(50))}, 100) == 50
    assert input_size({"inputs": {"image": ArrayData.from_list([0] * 10, "int64")}}, 100) == 80
    messages = [{"role": "user", "content": [{"type": "text", "text": "x" * 40}]}] * 1000
    assert 100 < input_size({"messages": messages}, 100) < 200  # stops once past the limit
