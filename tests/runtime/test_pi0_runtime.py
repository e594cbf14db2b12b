"""pi0 served by the real runtime, one server for the module: concurrent HTTP requests (absent cameras, a float
image) and openpi's client against the offline oracle (itself checked against transformers'
PI0ForConditionalGeneration), and server-drawn seeded noise. (``walkserve serve`` reading the family from
config.json and taking --tokenizer-path: ``tests/models/pi0/test_pi0_serving_plan.py``.)"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.api.real_server import in_thread_server
from walkserve.core.config import RuntimeConfig
from walkserve.models.pi0.files import load_policy_files
from walkserve.models.pi0.inputs import InputSpec, validate_inputs
from walkserve.models.pi0.observations import map_observation
from walkserve.models.pi0.predict import predict_actions
from walkserve.models.pi0.tiny import write_tiny_policy
from walkserve.models.pi0.weights import load_policy

pytestmark = pytest.mark.slow
HORIZON, TOL = 10, 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_policy("pi0", tmp_path_factory.mktemp("pi0-runtime") / "tiny-pi0", seed=5)


@pytest.fixture(scope="module")
def oracle(checkpoint):
    import torch

    torch.set_num_threads(1)
    policy, files = load_policy(checkpoint, progress=False), load_policy_files(checkpoint)
    spec = InputSpec.from_config(policy.config)
    return lambda raw: predict_actions(policy, files, validate_inputs(spec, raw)).actions


@pytest.fixture(scope="module")
def server(checkpoint):
    with in_thread_server("pi0", checkpoint, RuntimeConfig(worker_threads=1)) as s:
        yield s


@pytest.fixture(scope="module")
def url(server):
    return server.url


def _array(a: np.ndarray) -> dict:
    return {"type": "array", "dtype": str(a.dtype), "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}


def _raw(seed: int, cameras: tuple[str, ...]) -> dict:
    rng = np.random.default_rng(seed)
    raw = {cam: rng.integers(0, 256, (28, 28 + 4 * i, 3), dtype=np.uint8) for i, cam in enumerate(cameras)}
    return raw | {"state": rng.uniform(-2, 2, 8).astype(np.float32), "prompt": f"fold towel {seed}",
                  "noise": rng.standard_normal((HORIZON, 32)).astype(np.float32)}


def _post(url: str, raw: dict, params: dict | None = None) -> np.ndarray:
    inputs = {k: _array(v) if isinstance(v, np.ndarray) and k != "state" else v for k, v in raw.items()}
    inputs["state"] = raw["state"].tolist()
    answer = httpx.post(f"{url}/v1/generate", json={"task": "act", "inputs": inputs, "stream": False,
                                                    "params": params or {}}, timeout=60)
    assert answer.status_code == 200, answer.text
    return np.array(answer.json()["actions"], dtype=np.float32)


def test_concurrent_http_requests_equal_the_offline_oracle(url, oracle):
    camera_sets = [("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"), ("base_0_rgb",),
                   ("base_0_rgb", "right_wrist_0_rgb"), ("base_0_rgb", "left_wrist_0_rgb")] * 2
    raws = [_raw(i, cams) for i, cams in enumerate(camera_sets)]
    raws[1]["left_wrist_0_rgb"] = np.full((16, 16, 3), 0.5, dtype=np.float32)  # a float image in [0, 1]
    with ThreadPoolExecutor(len(raws)) as pool:
        answers = list(pool.map(lambda r: _post(url, r), raws))
    for raw, actions in zip(raws, answers):
        assert actions.shape == (HORIZON, 7)
        assert np.abs(actions - oracle(raw)).max() <= TOL


def test_server_drawn_noise_follows_the_seed(url):
    raw = _raw(20, ("base_0_rgb",))
    del raw["noise"]
    first, again, other = (_post(url, raw, {"seed": s}) for s in (11, 11, 12))
    assert np.array_equal(first, again) and not np.allclose(first, other)


def test_openpi_client_with_a_libero_observation(url, oracle):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    rng = np.random.default_rng(3)
    libero = {"observation/image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
              "observation/wrist_image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
              "observation/state": rng.uniform(-1, 1, 8), "prompt": "turn on the stove",
              "noise": rng.standard_normal((HORIZON, 32)).astype(np.float32)}
    policy = WebsocketClientPolicy(host=url.replace("http", "ws") + "/v1/openpi")
    meta = policy.get_server_metadata()
    assert meta["family"] == "pi0" and meta["action_horizon"] == HORIZON
    actions = policy.infer(libero)["actions"]
    assert np.abs(actions - oracle(map_observation(libero, tuple(meta["cameras"])))).max() <= TOL


async def _prefix_hits(engine) -> float:
    await engine.refresh_status()
    [stats] = [v for k, v in engine.stats().engines.items() if k.startswith("expert@")]
    return stats["prefix_hit_tokens"]


def test_a_robot_session_reuses_the_prefix_while_its_cameras_and_prompt_stay(server, oracle):
    """Over openpi's websocket, a robot's next observations: the state moved (pi0's state is its own token after
    the prefix, so the cameras' and prompt's K/V are reused), then a camera changed (all recomputed)."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    rng = np.random.default_rng(8)
    obs = {"observation/image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
           "observation/wrist_image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
           "observation/state": rng.uniform(-1, 1, 8), "prompt": "stack the cups",
           "noise": rng.standard_normal((HORIZON, 32)).astype(np.float32)}
    moved = {**obs, "observation/state": obs["observation/state"] + 0.3}
    changed = {**moved, "observation/wrist_image": np.roll(obs["observation/wrist_image"], 1, axis=0)}
    policy = WebsocketClientPolicy(host=server.url.replace("http", "ws") + "/v1/openpi")
    cameras = tuple(policy.get_server_metadata()["cameras"])
    hits = []
    for o in (obs, moved, changed):
        before = server.call(_prefix_hits(server.engine))
        actions = policy.infer(o)["actions"]
        hits.append(server.call(_prefix_hits(server.engine)) - before)
        assert np.abs(actions - oracle(map_observation(o, cameras))).max() <= TOL
    assert hits[0] == 0 and hits[1] > 0 and hits[2] == 0, hits
