"""Schema-driven fuzzing of the whole HTTP API against a live server of every family's tiny checkpoint.

One server per family (module-scoped, parametrized): schemathesis draws
schema-conforming and schema-violating requests for every operation in
/openapi.json. No request may get a 5xx, take longer than the per-request
timeout, or leave a worker dead: afterwards /health is ok with every worker
alive and a normal request of the family still succeeds. Every 4xx is the
error envelope with no traceback. ``WALKSERVE_FUZZ_EXAMPLES`` (``./dev fuzz``)
raises the example count.
"""

from __future__ import annotations

import argparse
import base64
import logging
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from schemathesis.generation.modes import GenerationMode
from websockets.exceptions import InvalidStatus

from tests.api.fuzzing import fuzz_operations, operations
from tests.api.real_server import in_thread_server
from tests.api.socket_fuzzing import (
    check_wrong_kinds_and_sizes,
    close_abruptly,
    fuzz_frames,
    infer,
    open_policy,
)
from walkserve.cli.tiny_cmd import FAMILIES
from walkserve.core.config import RuntimeConfig
from walkserve.models.pi0.observations import (
    DROID_GRIPPER,
    DROID_IMAGES,
    DROID_JOINTS,
    LIBERO_IMAGES,
    LIBERO_STATE,
)

pytestmark = pytest.mark.slow


def _array(a: np.ndarray) -> dict:
    return {"type": "array", "dtype": str(a.dtype), "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}


TEXT = ("/v1/completions", {"prompt": "The river", "max_tokens": 3})
CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
RNG = np.random.default_rng(0)
ENCODE = ("/v1/generate", {"task": "encode", "stream": False, "inputs": {
    "video": _array(RNG.integers(0, 256, (4, 64, 64, 3), dtype=np.uint8))}})
PI_INPUTS = {"base_0_rgb": _array(RNG.integers(0, 256, (28, 28, 3), dtype=np.uint8)), "state": [0.0] * 8,
             "prompt": "fold the towel"}


@dataclass(frozen=True)
class Family:
    """A tiny checkpoint to serve and one ordinary request it must still answer after the fuzzing."""

    name: str  # as ``walkserve tiny`` names it
    normal: tuple[str, dict[str, Any]]


FAMILY_TABLE = (
    Family("llama", TEXT),
    Family("qwen2", TEXT),
    Family("qwen3", CHAT),
    Family("orpheus", ("/v1/audio/speech", {"input": "hello", "voice": "tara", "response_format": "wav"})),
    Family("qwen3-omni", CHAT),
    Family("bagel", ("/v1/images/generations", {"prompt": "a red square", "size": "32x32", "steps": 2})),
    Family("vjepa2", ENCODE),
    Family("vjepa2-ac", ENCODE),
    Family("pi0", ("/v1/generate", {"task": "act", "stream": False, "inputs": PI_INPUTS})),
    Family("pi05", ("/v1/generate", {"task": "act", "stream": False, "inputs": PI_INPUTS})),
)
# Small limits keep every generated request short: tiny images, few tokens, few media parts.
LIMITS = {"max_image_pixels": 64 * 64, "max_n": 2, "default_max_tokens": 8, "max_media_parts": 4,
          "max_audio_seconds": 2.0, "max_speech_chars": 256, "max_ws_message_bytes": 64 * 1024}


@pytest.fixture(scope="module", params=FAMILY_TABLE, ids=lambda f: f.name)
def served(request, tmp_path_factory):
    family: Family = request.param
    tiny = FAMILIES[family.name]
    out = tmp_path_factory.mktemp("fuzz") / f"tiny-{family.name}"
    path = tiny.writer(argparse.Namespace(out_dir=out, seed=0, preset="tiny", snac="tiny"))
    with in_thread_server(tiny.serve_as or family.name, path, RuntimeConfig(max_running=8), **LIMITS) as server:
        yield family, server


@pytest.fixture(scope="module")
def ops(served) -> list:
    return operations(served[1].url)


@pytest.fixture
def server_errors(caplog):
    """ERROR records of the server (uvicorn's own logger does not propagate to the root, so it is watched too)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(caplog.handler)
    try:
        yield lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        uvicorn_log.removeHandler(caplog.handler)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_fuzz_every_operation(served, ops, mode, server_errors):
    statuses = fuzz_operations(ops, mode)
    assert server_errors() == []  # no request left a traceback in the server's log either
    assert statuses[4] > 0, statuses  # the fuzzer did reach the validators
    if mode == GenerationMode.POSITIVE:
        assert statuses[2] > 0, statuses


def test_openpi_socket(served, server_errors):
    """The websocket routes. A policy (task ``act``) answers every drawn frame, oversize and wrong-kind
    frames with an error frame and survives abrupt closes; any other family refuses the handshake (403)."""
    server = served[1]
    if "act" not in httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["capabilities"]:
        for path in ("/v1/openpi", "/"):
            with pytest.raises(InvalidStatus) as refused:
                open_policy(server.url, path)
            assert refused.value.response.status_code == 403
        return
    ws, metadata = open_policy(server.url)
    keys = [*metadata["cameras"], "state", "prompt", "noise", *DROID_IMAGES, DROID_JOINTS, DROID_GRIPPER,
            *LIBERO_IMAGES, LIBERO_STATE]
    ws.close()
    answers = fuzz_frames(server.url, keys)
    assert answers["error"] > 0, answers
    check_wrong_kinds_and_sizes(server.url, LIMITS["max_ws_message_bytes"])
    close_abruptly(server.url)
    assert infer(server.url).ndim == 2  # a barrier: the abandoned observations ran before this one answered
    health = httpx.get(f"{server.url}/health", timeout=10).json()
    assert health["ok"] and all(health["workers"].values()), health
    horizon_dim = (metadata["action_horizon"], metadata["action_dim"])
    assert infer(server.url).shape == horizon_dim and infer(server.url, "/").shape == horizon_dim
    # regression: a client gone mid-request made the route answer it anyway, then log the failed send as an
    # unexpected error and leave uvicorn an "Exception in ASGI application" traceback
    assert server_errors() == []


def test_server_healthy_after_fuzzing(served):
    """Runs last for its family (after the fuzz tests above): every worker alive, and an ordinary request answers."""
    family, server = served
    health = httpx.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["ok"], health.text
    assert health.json()["workers"] and all(health.json()["workers"].values()), health.json()
    path, body = family.normal
    answer = httpx.post(f"{server.url}{path}", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:500]
