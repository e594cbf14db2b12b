"""Any walk graph is servable: a world-model rollout and a thinker/talker model over /v1/generate, on the real runtime."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest

from tests.api.real_server import in_thread_server
from walkserve.core.array import ArrayData
from walkserve.core.request import RequestSpec
from walkserve.models.base import ModelRef
from walkserve.models.registry import load_model
from walkserve.testing.fixtures.base import FixtureParams
from walkserve.testing.reference import ReferenceExecutor


def post(url: str, body: dict) -> list[dict]:
    with httpx.Client(timeout=60) as client:
        r = client.post(f"{url}/v1/generate", json=body)
        assert r.status_code == 200, r.text
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]


def test_rollout_latents_over_http_equal_the_reference():
    frames = np.arange(18, dtype=np.float32).reshape(3, 6) / 10
    action = np.linspace(-1, 1, 6, dtype=np.float32)
    body = {
        "task": "generate",
        "inputs": {
            "frames": {"type": "array", "dtype": "float32", "shape": [3, 6], "data": base64.b64encode(frames.tobytes()).decode()},
            "action": action.tolist(),  # a flat number list works too
        },
        "modalities": ["latent"],
        "params": {"horizon": 4},
    }
    spec = RequestSpec(
        {"frames": ArrayData("float32", (3, 6), frames.tobytes()), "action": ArrayData("float32", (6,), action.tobytes())},
        params=FixtureParams(horizon=4),
    )
    want = ReferenceExecutor.for_model(load_model(ModelRef("fixture-rollout"))).run(spec)
    with in_thread_server("fixture-rollout", None) as server:
        lines = post(server.url, body)
        outputs = [line for line in lines if line["type"] == "output"]
        assert [o["iteration"] for o in outputs] == [[k] for k in range(4)]
        for got, ref in zip(outputs, want.outputs, strict=True):
            data = got["data"]
            values = np.frombuffer(base64.b64decode(data["data"]), dtype=data["dtype"]).reshape(data["shape"])
            assert np.allclose(values, ref.value.numpy(), atol=1e-6)
        assert lines[-1]["type"] == "finished" and lines[-1]["finish_reason"] == "stop"
        # a model without a processor of its own takes only /v1/generate, and says so
        with httpx.Client(timeout=30) as client:
            r = client.post(f"{server.url}/v1/completions", json={"model": "fixture-rollout", "prompt": "hi"})
            assert r.status_code == 400 and r.json()["error"]["message"]
            bad = client.post(f"{server.url}/v1/generate", json={**body, "inputs": {"frames": [1, "x"]}})
            assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("inputs")


@pytest.mark.parametrize("text_len", [2, 5])
def test_thinker_talker_streams_text_and_audio(text_len):
    body = {
        "task": "generate",
        "inputs": {"prompt_ids": [5, 6, 7]},
        "modalities": ["text", "audio"],
        "sampling": {"max_tokens": 12},
        "params": {"text_len": text_len, "audio_len": 30},
    }
    with in_thread_server("fixture-omni", None) as server:
        lines = post(server.url, body)
    kinds = [(line["type"], line.get("modality")) for line in lines]
    assert kinds.count(("output", "text")) == text_len
    assert kinds.count(("output", "audio")) == 2  # 30 codes: LeftContext(25, 25) gives a chunk of 25 and a tail of 5
    assert lines[-1]["finish_reason"] == "stop"
