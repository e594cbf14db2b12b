"""pi0.5 served by the real runtime (one server for the module): HTTP, openpi's own client, joins mid-loop, errors.

The checkpoint is a tiny random pi0.5 whose flow takes more steps than a real
one's 10, so that later requests join a flow loop while it runs. Every chunk
is compared with the offline oracle (``predict.predict_actions``, itself
checked against lerobot's goldens) on the same explicit noise.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json

import httpx
import numpy as np
import pytest

from tests.api.real_server import in_thread_server
from walkserve.core.config import RuntimeConfig
from walkserve.core.outputs import RequestFinished
from walkserve.core.sampling import SamplingParams
from walkserve.models.pi0.files import load_policy_files
from walkserve.models.pi0.inputs import InputSpec, validate_inputs
from walkserve.models.pi0.observations import map_observation
from walkserve.models.pi0.predict import predict_actions
from walkserve.models.pi0.tiny import write_tiny_policy
from walkserve.models.pi0.weights import load_policy

pytestmark = pytest.mark.slow
STEPS, HORIZON, TOL = 40, 10, 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = write_tiny_policy("pi05", tmp_path_factory.mktemp("pi05-runtime") / "tiny-pi05", seed=4)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_inference_steps": STEPS}))
    return path


@pytest.fixture(scope="module")
def oracle(checkpoint):
    import torch

    torch.set_num_threads(1)
    policy, files = load_policy(checkpoint, progress=False), load_policy_files(checkpoint)
    spec = InputSpec.from_config(policy.config)
    return lambda raw: predict_actions(policy, files, validate_inputs(spec, raw)).actions


@pytest.fixture(scope="module")
def server(checkpoint):
    with in_thread_server("pi05", checkpoint, RuntimeConfig(max_running=16, worker_threads=1),
                          max_image_pixels=4096) as s:
        yield s


def _observation(seed: int, cameras=("base_0_rgb", "left_wrist_0_rgb")) -> dict:
    rng = np.random.default_rng(seed)
    out = {cam: rng.integers(0, 256, (24 + seed % 5, 30, 3), dtype=np.uint8) for cam in cameras}
    return out | {"state": rng.uniform(-1.5, 1.5, 8).astype(np.float32), "prompt": f"put block {seed} in the bowl",
                  "noise": rng.standard_normal((HORIZON, 32)).astype(np.float32)}


def _png_part(image: np.ndarray) -> dict:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return {"type": "image", "url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}


def _array_part(a: np.ndarray) -> dict:
    return {"type": "array", "dtype": str(a.dtype), "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}


def _body(obs: dict) -> dict:
    inputs = {k: _png_part(v) for k, v in obs.items() if k.endswith("_rgb")}
    inputs |= {"state": obs["state"].tolist(), "prompt": obs["prompt"], "noise": _array_part(obs["noise"])}
    return {"task": "act", "inputs": inputs, "stream": False}


def test_card_says_it_acts(server):
    [card] = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert card["family"] == "pi05" and {"act", "image_in"} <= set(card["capabilities"]) and card["random_weights"]


def test_http_act_equals_the_offline_oracle(server, oracle):
    obs = _observation(1)
    answer = httpx.post(f"{server.url}/v1/generate", json=_body(obs), timeout=60)
    assert answer.status_code == 200, answer.text
    actions = np.array(answer.json()["actions"], dtype=np.float32)
    assert actions.shape == (HORIZON, 7)
    assert np.abs(actions - oracle(obs)).max() <= TOL
    lines = [json.loads(x) for x in httpx.post(f"{server.url}/v1/generate", json={**_body(obs), "stream": True},
                                               timeout=60).text.splitlines()]
    [event] = [x for x in lines if x["type"] == "output"]
    assert event["modality"] == "action" and event["data"]["shape"] == [HORIZON, 7]
    raw = np.frombuffer(base64.b64decode(event["data"]["data"]), dtype=np.float32).reshape(HORIZON, 7)
    assert np.array_equal(raw, actions) and lines[-1]["finish_reason"] == "stop"


def test_openpi_client_round_trips_droid_and_libero_observations(server, oracle):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    rng = np.random.default_rng(7)
    droid = {"observation/exterior_image_1_left": rng.integers(0, 256, (36, 64, 3), dtype=np.uint8),
             "observation/wrist_image_left": rng.integers(0, 256, (36, 64, 3), dtype=np.uint8),
             "observation/joint_position": rng.uniform(-1, 1, 7), "observation/gripper_position": rng.uniform(0, 1, 1),
             "prompt": "put the marker in the cup", "noise": rng.standard_normal((HORIZON, 32)).astype(np.float32)}
    policy = WebsocketClientPolicy(host=server.url.replace("http", "ws") + "/v1/openpi")
    meta = policy.get_server_metadata()
    assert (meta["family"], meta["action_horizon"], meta["action_dim"], meta["state_dim"]) == ("pi05", HORIZON, 7, 8)
    result = policy.infer(droid)
    assert result["actions"].dtype == np.float32 and result["actions"].shape == (HORIZON, 7)
    assert result["server_timing"]["infer_ms"] > 0
    cameras = tuple(meta["cameras"])
    assert np.abs(result["actions"] - oracle(map_observation(droid, cameras))).max() <= TOL
    with pytest.raises(RuntimeError, match=r'"param": "observation/joint_position"'):
        policy.infer({k: v for k, v in droid.items() if k != "observation/joint_position"})
    assert policy.infer(droid)["actions"].shape == (HORIZON, 7)  # the connection survives an error frame
    host, port = server.url.removeprefix("http://").split(":")
    libero = {"observation/image": rng.integers(0, 256, (40, 40, 3), dtype=np.uint8),
              "observation/wrist_image": rng.integers(0, 256, (40, 40, 3), dtype=np.uint8),
              "observation/state": rng.uniform(-1, 1, 8), "prompt": "open the top drawer",
              "noise": rng.standard_normal((HORIZON, 32)).astype(np.float32)}
    at_root = WebsocketClientPolicy(host=host, port=int(port))  # openpi's robot examples, unchanged: path "/"
    got = at_root.infer(libero)["actions"]
    assert np.abs(got - oracle(map_observation(libero, cameras))).max() <= TOL


async def _actions(engine, spec) -> tuple[np.ndarray, RequestFinished]:
    out, finished = None, None
    async for event in engine.generate(spec):
        if isinstance(event, RequestFinished):
            finished = event
        else:
            out = np.frombuffer(event.data.data, dtype=np.float32).reshape(event.data.shape)
    return out, finished


async def _flow_steps(engine) -> int:
    await engine.refresh_status()
    return int(engine.stats().nodes.get("flow_step", {}).get("items", 0))


def _expert_calls(engine) -> tuple[float, float]:
    [stats] = [v for k, v in engine.stats().engines.items() if k.startswith("expert@")]
    return stats["forwards.expert"], stats["forward_chunks.expert"]


def test_requests_that_join_a_running_flow_loop_get_the_actions_they_get_alone(server, oracle):
    """A starts; B joins once A is a few steps into its loop, C and D a few steps later: every chunk is the
    one the request gets alone, and the expert ran steps of several requests (at different flow times) at once."""
    engine = server.engine
    processor = engine.processor
    observations = [_observation(10 + i) for i in range(4)]
    specs = [processor.build_request("act", {"inputs": o}, SamplingParams(), processor.check_params({})) for o in observations]
    alone = [server.call(_actions(engine, processor.build_request("act", {"inputs": o}, SamplingParams(), processor.check_params({}))))[0]
             for o in observations]

    async def scenario():
        await engine.refresh_status()
        calls0 = _expert_calls(engine)
        base = await _flow_steps(engine)
        tasks = [asyncio.ensure_future(_actions(engine, specs[0]))]
        seen = []
        for wave in ([specs[1]], specs[2:]):
            while (done := await _flow_steps(engine) - base) < 3 * len(tasks):
                await asyncio.sleep(0)
            seen.append(done)
            tasks += [asyncio.ensure_future(_actions(engine, s)) for s in wave]
        results = await asyncio.gather(*tasks)
        await engine.refresh_status()
        return results, seen, calls0, _expert_calls(engine)

    results, seen, (f0, c0), (f1, c1) = server.call(scenario())
    assert seen[0] < STEPS, f"A had finished its {STEPS} steps before B joined: {seen}"  # A was mid-loop
    for (actions, finished), want, obs in zip(results, alone, observations):
        assert finished.reason.value == "stop", finished
        assert np.abs(actions - want).max() <= 1e-5
        assert np.abs(actions - oracle(obs)).max() <= TOL
    assert f1 - f0 < 4 * STEPS and c1 - c0 == 4 * STEPS  # 4 loops of STEPS queries, fewer expert calls


def _kv_stats(engine) -> dict[str, float]:
    [stats] = [v for k, v in engine.stats().engines.items() if k.startswith("expert@")]
    return stats


def _prefix_calls(engine) -> tuple[float, float, float, float]:
    """(PaliGemma forwards, requests' prefixes they carried, prefix rows from the prefix cache, SigLIP calls)."""
    stats = _kv_stats(engine)
    return (stats["forwards.lm"], stats["forward_chunks.lm"], stats["prefix_hit_tokens"],
            engine.stats().nodes["vision"]["batches"])


def test_prefixes_that_arrive_together_run_in_one_forward_and_get_the_actions_they_get_alone(server, oracle):
    """While A's flow loop runs, six requests arrive at once: their cameras go through SigLIP in shared calls and
    their prefixes through PaliGemma in shared forwards (several requests' prefixes, ragged, in one), and each
    chunk is the one the request gets alone (asked again afterwards, one at a time)."""
    engine = server.engine
    processor = engine.processor
    observations = [_observation(30 + i, cameras=("base_0_rgb",) if i % 3 == 0 else ("base_0_rgb", "left_wrist_0_rgb"))
                    for i in range(7)]
    build = lambda o: processor.build_request("act", {"inputs": o}, SamplingParams(),  # noqa: E731
                                              processor.check_params({}))

    async def scenario():
        await engine.refresh_status()
        before = _prefix_calls(engine)
        base = await _flow_steps(engine)
        first = asyncio.ensure_future(_actions(engine, build(observations[0])))
        while await _flow_steps(engine) - base < 2:
            await asyncio.sleep(0)
        results = await asyncio.gather(first, *(_actions(engine, build(o)) for o in observations[1:]))
        await engine.refresh_status()
        return results, before, _prefix_calls(engine)

    results, (f0, c0, h0, v0), (f1, c1, h1, v1) = server.call(scenario())
    alone = [server.call(_actions(engine, build(o)))[0] for o in observations]
    for (actions, finished), want, obs in zip(results, alone, observations):
        assert finished.reason.value == "stop", finished
        assert np.abs(actions - want).max() <= 1e-5
        assert np.abs(actions - oracle(obs)).max() <= TOL
    assert c1 - c0 == 7 and h1 == h0  # one whole prefix each, none from the prefix cache
    assert f1 - f0 <= 3 and v1 - v0 <= 3  # A alone, then the six together (measured: 2 and 2; 3 if they straddle a step)


def test_an_unchanged_observation_reuses_its_prefix_and_a_changed_one_recomputes_it(server, oracle):
    """A robot asks again with the same cameras, state and prompt: its prefix comes from the prefix cache (all but
    the last rows) and the chunk equals the first one (same noise) or the oracle's (new noise). One changed pixel,
    or another prompt, and nothing is reused."""
    engine = server.engine
    processor = engine.processor
    obs = _observation(50)
    pixel = {**obs, "left_wrist_0_rgb": obs["left_wrist_0_rgb"].copy()}
    pixel["left_wrist_0_rgb"][5, 7, 2] ^= 1
    cases = [("first", obs, 0), ("again", obs, 1), ("new noise", {**obs, "noise": obs["noise"][::-1].copy()}, 1),
             ("one pixel", pixel, 0), ("prompt", {**obs, "prompt": "put block 50 in the cup"}, 0)]
    spec = processor.build_request("act", {"inputs": obs}, SamplingParams(), processor.check_params({}))
    reusable = (spec.inputs["tokens"].shape[0] - 1) // 16 * 16  # whole 16-row blocks before the last row
    got = {}
    for name, o, reused in cases:
        before = server.call(_hits(engine))
        request = processor.build_request("act", {"inputs": o}, SamplingParams(), processor.check_params({}))
        actions, finished = server.call(_actions(engine, request))
        assert finished.reason.value == "stop", finished
        assert server.call(_hits(engine)) - before == reused * reusable, name
        assert np.abs(actions - oracle(o)).max() <= TOL, name
        got[name] = actions
    assert reusable > 0 and np.abs(got["again"] - got["first"]).max() <= 1e-5


async def _hits(engine) -> float:
    await engine.refresh_status()
    return _kv_stats(engine)["prefix_hit_tokens"]


@pytest.mark.parametrize(("change", "param"), [
    ({"state": None}, "inputs.state"),
    ({"state": [0.0] * 3}, "inputs.state"),
    ({"base_0_rgb": None}, "inputs.base_0_rgb"),
    ({"base_0_rgb": {"type": "image", "url": "data:image/png;base64," + base64.b64encode(b"junk").decode()}},
     "inputs.base_0_rgb.url"),
    ({"left_wrist_0_rgb": "big"}, "inputs.left_wrist_0_rgb.url"),
    ({"prompt": "go " * 80}, "inputs.prompt"),
    ({"noise": [0.5] * 32}, "inputs.noise"),
])
def test_bad_input_is_a_400_naming_the_field(server, change, param):
    body = _body(_observation(3))
    if change.get("left_wrist_0_rgb") == "big":  # over the server's --max-image-pixels (4096 here)
        change = {"left_wrist_0_rgb": _png_part(np.zeros((80, 80, 3), dtype=np.uint8))}
    body["inputs"] = {k: v for k, v in {**body["inputs"], **change}.items() if v is not None}
    answer = httpx.post(f"{server.url}/v1/generate", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.json()
