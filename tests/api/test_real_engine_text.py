"""The HTTP API over the real runtime serving a tiny random-weight Llama.

One server per module (an AsyncEngine with its conductor and worker process,
uvicorn on the same loop). Every greedy answer the official ``openai`` client
gets is compared with the same request sent straight to the engine.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from tests.api.real_server import in_thread_server, metric, metrics, wait_for
from walkserve.api.openai.choices import token_ids
from walkserve.core.config import RuntimeConfig
from walkserve.core.sampling import SamplingParams
from walkserve.models.llama.tiny import write_tiny

pytestmark = pytest.mark.slow
PROMPT = "The river flows"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me about rivers."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny("llama", tmp_path_factory.mktemp("real-llama") / "tiny-llama", seed=3)
    with in_thread_server("llama", path, RuntimeConfig(max_running=8)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def direct(server, task: str, payload: dict, **sampling):
    """(token ids, text, RequestFinished, prompt length) of the request sent straight to the engine."""
    processor = server.engine.processor
    spec = processor.build_request(task, payload, SamplingParams(**sampling), processor.check_params({}))
    events, finished = server.run_direct(spec)
    ids = [t for e in events if e.modality == "text" for t in token_ids(e.data)]
    return ids, processor.decode(ids), finished, len(spec.inputs["prompt_token_ids"].tolist())


def test_models_card_says_random_weights(server, client):
    [model] = client.models.list().data
    extra = model.model_extra
    assert model.id == "tiny-llama" and extra["family"] == "llama" and extra["random_weights"] is True
    assert {"completions", "chat", "generate"} <= set(extra["capabilities"])
    assert extra["max_context"] == 1024


def test_completion_greedy_equals_engine(server, client):
    ids, text, finished, n_prompt = direct(server, "completion", {"prompt": PROMPT}, max_tokens=12, temperature=0.0,
                                           ignore_eos=True)
    assert len(ids) == 12 and finished.reason.value == "length"
    extra = {"ignore_eos": True}
    answer = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=12, temperature=0, extra_body=extra)
    assert answer.choices[0].text == text and answer.choices[0].finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (n_prompt, 12)
    stream = client.completions.create(prompt=PROMPT, max_tokens=12, temperature=0, extra_body=extra, stream=True,
                                       stream_options={"include_usage": True}, model="tiny-llama")
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == n_prompt


def test_completion_that_stops_at_eos_equals_engine(server, client):
    eos = server.engine.processor.eos_token_ids[0]
    bias = ((eos, 100.0),)  # end-of-text as likely as it gets: it is the first token sampled
    ids, text, finished, _ = direct(server, "completion", {"prompt": "Once"}, max_tokens=40, temperature=0.0,
                                    logit_bias=bias)
    assert finished.reason.value == "stop" and ids == []
    answer = client.completions.create(model="tiny-llama", prompt="Once", max_tokens=40, temperature=0,
                                       logit_bias={str(eos): 100})
    assert answer.choices[0].text == text == "" and answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens == len(ids) == 0  # the answer's tokens; the stop token is not one of them


def test_chat_greedy_equals_engine(server, client):
    ids, text, _, n_prompt = direct(server, "chat", {"messages": MESSAGES}, max_tokens=10, temperature=0.0,
                                    ignore_eos=True)
    assert len(ids) == 10
    extra = {"ignore_eos": True}
    answer = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=10, temperature=0,
                                            extra_body=extra)
    message = answer.choices[0].message
    assert message.role == "assistant" and message.content == text
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (n_prompt, 10)
    stream = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_completion_tokens=10,
                                            temperature=0, extra_body=extra, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_a_developer_message_is_the_system_message(client):
    """OpenAI's newer name for the system prompt; chat templates know only "system" (the tiny ones refuse others)."""
    args = {"model": "tiny-llama", "max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}
    system = client.chat.completions.create(messages=MESSAGES, **args)
    developer = client.chat.completions.create(messages=[{**MESSAGES[0], "role": "developer"}, MESSAGES[1]], **args)
    assert developer.choices[0].message.content == system.choices[0].message.content
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens


def token_name(server, token_id: int) -> tuple[str, list[int]]:
    """(text, bytes) a logprobs entry names a token by: its vocabulary bytes, from transformers' tokenizer."""
    from transformers import AutoTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ref = token_name.cache.get(server.url)
    if ref is None:
        ref = token_name.cache[server.url] = AutoTokenizer.from_pretrained(server.engine.spec.model_path)
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    raw = bytes(byte_of[c] for c in ref.convert_ids_to_tokens(token_id))
    try:
        return raw.decode(), list(raw)
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)


token_name.cache = {}


def direct_logprobs(server, task: str, payload: dict, k: int, **sampling) -> list[tuple[int, float, list[int], list[float]]]:
    """(token, logprob, top ids, top logprobs) per generated token, straight from the engine."""
    spec = server.engine.processor.build_request(task, payload, SamplingParams(logprobs=k, **sampling), server.engine.processor.check_params({}))
    events, _ = server.run_direct(spec)
    by_iteration: dict = {}
    for e in events:
        by_iteration.setdefault(e.iteration, {})["text" if e.modality == "text" else e.output] = e.data.tolist()
    return [(p["text"][0], p["logprob"][0], p["top_logprob_ids"], p["top_logprobs"])
            for _, p in sorted(by_iteration.items())]


def test_completion_logprobs_equal_the_engine_streamed_or_not(server, client):
    want = direct_logprobs(server, "completion", {"prompt": PROMPT}, 3, max_tokens=8, temperature=0.0, ignore_eos=True)
    assert len(want) == 8
    extra = {"ignore_eos": True}
    answer = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                       extra_body=extra)
    lp = answer.choices[0].logprobs
    assert lp.tokens == [token_name(server, t)[0] for t, _, _, _ in want]
    assert lp.token_logprobs == pytest.approx([w[1] for w in want], abs=1e-6)
    for top, (_, _, ids, values) in zip(lp.top_logprobs, want, strict=True):
        assert top == pytest.approx({token_name(server, i)[0]: v for i, v in zip(ids, values, strict=True)}, abs=1e-6)
    raw = [bytes(token_name(server, t)[1]) for t, _, _, _ in want]
    assert b"".join(raw).decode("utf-8", errors="replace") == answer.choices[0].text
    assert lp.text_offset == [len(b"".join(raw[:i]).decode("utf-8", errors="ignore")) for i in range(8)]
    stream = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                       extra_body=extra, stream=True)
    streamed = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    assert [t for part in streamed for t in part.tokens] == lp.tokens
    assert [v for part in streamed for v in part.token_logprobs] == lp.token_logprobs
    assert [o for part in streamed for o in part.text_offset] == lp.text_offset
    plain = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=8, temperature=0, extra_body=extra)
    assert plain.choices[0].logprobs is None and plain.choices[0].text == answer.choices[0].text


def test_chat_logprobs_equal_the_engine(server, client):
    want = direct_logprobs(server, "chat", {"messages": MESSAGES}, 2, max_tokens=6, temperature=0.0, ignore_eos=True)
    answer = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = answer.choices[0].logprobs.content
    assert [(c.token, c.bytes) for c in content] == [token_name(server, t) for t, _, _, _ in want]
    assert [c.logprob for c in content] == pytest.approx([w[1] for w in want], abs=1e-6)
    for c, (_, _, ids, values) in zip(content, want, strict=True):
        assert [(t.token, t.bytes) for t in c.top_logprobs] == [token_name(server, i) for i in ids]
        assert [t.logprob for t in c.top_logprobs] == pytest.approx(values, abs=1e-6)
    stream = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=6, temperature=0,
                                            logprobs=True, extra_body={"ignore_eos": True}, stream=True)
    streamed = [t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [c.token for c in content]
    assert all(t.top_logprobs == [] for t in streamed)  # top_logprobs not asked for: none


def test_concurrent_greedy_requests_each_equal_the_engine(server):
    """Requests batched together in the runtime answer exactly as they do alone."""
    prompts = ["A cat", "The sea is", "Numbers: 1 2 3", "Why"]
    want = [direct(server, "completion", {"prompt": p}, max_tokens=8, temperature=0.0, ignore_eos=True)[1]
            for p in prompts]

    async def ask_all():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as aclient:
            answers = await asyncio.gather(*(
                aclient.completions.create(model="tiny-llama", prompt=p, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True}) for p in prompts))
        return [a.choices[0].text for a in answers]

    assert asyncio.run(ask_all()) == want


def test_native_generate_task_equals_engine(server):
    ids, text, _, _ = direct(server, "completion", {"prompt": PROMPT}, max_tokens=6, temperature=0.0, ignore_eos=True)
    body = {"task": "generate", "inputs": {"prompt": PROMPT}, "sampling": {"max_tokens": 6, "temperature": 0,
                                                                           "ignore_eos": True}}
    with httpx.stream("POST", f"{server.url}/v1/generate", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        lines = [json.loads(line) for line in response.iter_lines() if line]
    outputs = [line for line in lines if line["type"] == "output"]
    assert [t for o in outputs for t in o["data"]["token_ids"]] == ids
    assert "".join(o["data"]["text"] for o in outputs) + lines[-1]["text"] == text
    assert lines[-1]["type"] == "finished" and lines[-1]["finish_reason"] == "length"


def test_logit_bias_forces_and_bans_tokens(server, client):
    ids, _, _, _ = direct(server, "completion", {"prompt": PROMPT}, max_tokens=6, temperature=0.0, ignore_eos=True)
    forced = direct(server, "completion", {"prompt": PROMPT}, max_tokens=6, temperature=0.0, ignore_eos=True,
                    logit_bias=((ids[1], 100.0),))[0]
    assert forced == [ids[1]] * 6
    extra = {"ignore_eos": True}
    answer = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=6, temperature=0,
                                       logit_bias={str(ids[1]): 100}, extra_body=extra, logprobs=0)
    assert answer.choices[0].logprobs.tokens == [token_name(server, ids[1])[0]] * 6
    banned = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=6, temperature=0,
                                            logit_bias={str(ids[0]): -100}, logprobs=True, extra_body=extra)
    chat_ids, _, _, _ = direct(server, "chat", {"messages": MESSAGES}, max_tokens=6, temperature=0.0, ignore_eos=True,
                               logit_bias=((ids[0], -100.0),))
    assert ids[0] not in chat_ids
    assert [c.token for c in banned.choices[0].logprobs.content] == [token_name(server, t)[0] for t in chat_ids]
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=2, logit_bias={"99999999": 5})


def test_native_generate_streams_logprob_events(server):
    want = direct_logprobs(server, "completion", {"prompt": PROMPT}, 2, max_tokens=4, temperature=0.0, ignore_eos=True)
    body = {"task": "generate", "inputs": {"prompt": PROMPT},
            "sampling": {"max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 2}}
    with httpx.stream("POST", f"{server.url}/v1/generate", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        lines = [json.loads(line) for line in response.iter_lines() if line]
    got: dict = {}
    for line in lines:
        if line["type"] == "output" and line["modality"] == "logprobs":
            got.setdefault(line["output"], []).append(line["data"]["values"])
    assert [v[0] for v in got["logprob"]] == pytest.approx([w[1] for w in want], abs=1e-6)
    assert got["top_logprob_ids"] == [w[2] for w in want]


def test_metrics_move(server, client):
    before = metrics(server.url)
    client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=5, temperature=0)
    # seeded: unseeded, the random LM's first token is its stop token in about one answer in 150 (2 of 300 seeds),
    # an answer with no text and so no time to first token
    stream = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=5, stream=True, seed=7)
    chunks = list(stream)
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    after = wait_for(lambda: _finished_moved(server.url, before, 2), timeout=3)
    assert after, "engine counters did not move"
    for route in ("/v1/completions", "/v1/chat/completions"):
        for name in ("walkserve_time_to_first_token_seconds_count", "walkserve_e2e_request_latency_seconds_count"):
            assert metric(after, name, route=route) >= metric(before, name, route=route) + 1, (name, route)
    assert metric(after, "walkserve_generation_tokens_total", route="/v1/completions") > metric(
        before, "walkserve_generation_tokens_total", route="/v1/completions")
    assert metric(after, "walkserve_kv_blocks_total") > 0 and metric(after, "walkserve_healthy") == 1


def _finished_moved(url: str, before: dict, n: int):
    now = metrics(url)
    key = "walkserve_engine_requests_total"
    return now if metric(now, key, outcome="finished") >= metric(before, key, outcome="finished") + n else None


def test_disconnect_mid_stream_frees_runtime_state(server):
    """KV blocks and per-request state are in use while a stream runs and back to 0 within a second of the
    client going away (as engine.stats() reports them, and /metrics with it)."""
    engine = server.engine
    body = {"prompt": PROMPT, "max_tokens": 900, "ignore_eos": True, "stream": True}
    aborted_before = engine.stats().aborted
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{server.url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        busy = False
        for line in response.iter_lines():  # keep reading (the stream flows) until the stats show the run
            if line.startswith("data: {") and _busy(engine.stats()) and _busy_metrics(metrics(server.url)):
                busy = True
                break
        assert busy, "KV blocks and request state should show in use while the stream runs"
    closed_at = time.monotonic()
    freed = wait_for(lambda: engine.stats().requests_with_state == 0 and engine.stats().kv_blocks_used == 0
                     and engine.stats().running == 0, timeout=3, interval=0.02)
    took = time.monotonic() - closed_at
    assert freed, engine.stats()
    assert took < 1.0, f"state freed only {took:.2f} s after the client left"
    assert engine.stats().aborted == aborted_before + 1
    scraped = metrics(server.url)
    assert metric(scraped, "walkserve_kv_blocks_used") == 0 and metric(scraped, "walkserve_requests_with_state") == 0


def _busy(stats) -> bool:
    return stats.kv_blocks_used > 0 and stats.requests_with_state > 0 and stats.running == 1


def _busy_metrics(scraped: dict) -> bool:
    return (metric(scraped, "walkserve_kv_blocks_used") > 0 and metric(scraped, "walkserve_kv_usage_ratio") > 0
            and metric(scraped, "walkserve_requests_with_state") > 0)


def test_a_stop_string_finishes_the_request_it_does_not_abort_it(server, client):
    """The client sees finish_reason "stop"; the runtime's counters and /metrics count a finished request."""
    _, text, _, _ = direct(server, "completion", {"prompt": PROMPT}, max_tokens=12, temperature=0.0, ignore_eos=True)
    stop = text[3:6]
    assert len(stop) == 3 and text.index(stop) == 3
    engine = server.engine
    server.call(engine.refresh_status())
    before, scraped = engine.stats(), metrics(server.url)
    answer = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=400, temperature=0, stop=[stop],
                                       extra_body={"ignore_eos": True})
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].text == text[:3]

    def settled():
        server.call(engine.refresh_status())
        now = engine.stats()
        return now if now.running == 0 and now.finished + now.aborted > before.finished + before.aborted else None

    after = wait_for(settled, timeout=3)
    assert after, engine.stats()
    assert (after.finished - before.finished, after.aborted - before.aborted) == (1, 0)
    scraped_after = metrics(server.url)
    route = {"route": "/v1/completions"}
    assert metric(scraped_after, "walkserve_request_finish_total", reason="stop", **route) == metric(
        scraped, "walkserve_request_finish_total", reason="stop", **route) + 1
    assert metric(scraped_after, "walkserve_request_finish_total", reason="abort", **route) == metric(
        scraped, "walkserve_request_finish_total", reason="abort", **route)
