"""/metrics: request histograms from the API, runtime gauges from engine.stats(), response counters."""

from __future__ import annotations

import re

from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

from .helpers import asgi_client


def value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, re.M)
    assert match, sample
    return float(match.group(1))


async def test_metrics_cover_text_speech_and_runtime() -> None:
    engine = FakeEngine(FakeEngineConfig(audio=True, token_delay_s=0.001))
    async with asgi_client(engine) as client:
        await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5})
        await client.post("/v1/audio/speech", json={"input": "sixteen chars!!!", "response_format": "wav"})
        await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 0})
        response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert value(text, 'walkserve_time_to_first_token_seconds_count{route="/v1/completions"}') == 1
    assert value(text, 'walkserve_inter_token_latency_seconds_count{route="/v1/completions"}') == 4
    assert value(text, 'walkserve_generation_tokens_total{route="/v1/completions"}') == 5
    assert value(text, 'walkserve_time_to_first_audio_seconds_count{route="/v1/audio/speech"}') == 1
    assert value(text, 'walkserve_audio_output_seconds_total{route="/v1/audio/speech"}') == 0.2
    assert 0 < value(text, 'walkserve_speech_real_time_factor_sum{route="/v1/audio/speech"}') < 10
    assert value(text, 'walkserve_request_queue_seconds_count{route="/v1/completions"}') == 1
    assert value(text, 'walkserve_e2e_request_latency_seconds_count{route="/v1/audio/speech"}') == 1
    assert value(text, 'walkserve_request_finish_total{reason="length",route="/v1/completions"}') == 1
    assert value(text, "walkserve_requests_running") == 0 and value(text, "walkserve_requests_waiting") == 0
    assert value(text, "walkserve_kv_blocks_total") == 32 and value(text, "walkserve_preemptions_total") == 0
    assert value(text, 'walkserve_engine_requests_total{outcome="finished"}') == 2
    assert value(text, 'walkserve_node_batch_size_mean{node="fake_lm"}') == 1
    assert value(text, 'walkserve_node_step_seconds_mean{node="fake_lm"}') > 0
    assert value(text, 'walkserve_node_batches_total{node="fake_lm"}') == 7  # 5 tokens + 2 audio chunks
    assert value(text, 'walkserve_http_responses_total{route="/v1/completions",status="200"}') == 1
    assert value(text, 'walkserve_http_client_errors_total{route="/v1/completions",status="400"}') == 1
    assert value(text, "walkserve_healthy") == 1 and value(text, "walkserve_draining") == 0


async def test_each_app_has_its_own_registry() -> None:
    async with asgi_client() as first, asgi_client() as second:
        await first.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert "walkserve_time_to_first_token_seconds_count" not in (await second.get("/metrics")).text
