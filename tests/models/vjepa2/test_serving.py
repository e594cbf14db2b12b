"""V-JEPA 2-AC served over HTTP by the full runtime, against the offline loops on the same weights.

One server per module, on the shipped ``vjepa2-ac-split`` placement (every encoder node on rank 1, so the
frame tokens cross ranks to the predictor), over a tiny random AC checkpoint (16 tokens per frame, so
P = 18 rows a step). Requests of every task run concurrently, joining while others are
mid-flight: rollouts of different lengths and context sizes (streamed, one frame per step), a plan from
one and from two context frames (K candidate contexts of one request per CEM step), video features from
an array, a frames data URL and a video file, and /v1/embeddings through the openai client. Each answer
must equal the offline oracle from phase 1 (float32, <= 1e-4): ``official_rollout`` (the released loop,
no cache) on the features of our encoder's DROID transform, ``cem.plan`` with the same seed, and the
encoder's evaluation transform (the encoder itself is tested against ``VJEPA2Model`` and cc-vjepa2 in
test_vjepa2_encoder.py). Bad input is a 400 naming the field.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from dataclasses import replace

import httpx
import numpy as np
import openai
import pytest
import torch

from tests.api.real_server import in_thread_server
from walkserve.core.config import RuntimeConfig
from walkserve.engines.spec import Batch
from walkserve.models.vjepa2.cem import CEMConfig, plan
from walkserve.models.vjepa2.encoder_component import EncoderComponent
from walkserve.models.vjepa2.preprocess import as_given_pixels
from walkserve.models.vjepa2.rollout import official_rollout
from walkserve.models.vjepa2.tiny import write_tiny_vjepa2_ac
from walkserve.models.vjepa2.video_file import decode_video_file
from walkserve.models.vjepa2.weights import load_ac_predictor, load_encoder
from walkserve.placements import path as placement_path

pytestmark = [pytest.mark.slow]
TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def ac_dir(tmp_path_factory):
    return write_tiny_vjepa2_ac(tmp_path_factory.mktemp("vjepa2_served") / "tiny-vjepa2-ac", seed=4)


@pytest.fixture(scope="module")
def server(ac_dir):
    with in_thread_server("vjepa2", ac_dir, RuntimeConfig(max_running=16),
                          placement=str(placement_path("vjepa2-ac-split")), max_media_parts=4) as s:
        yield s


@pytest.fixture(scope="module")
def oracle(ac_dir):
    torch.set_num_threads(1)
    encoder = load_encoder(ac_dir)
    return EncoderComponent(encoder, "ac_frames"), EncoderComponent(encoder, "video"), load_ac_predictor(ac_dir)


# -- what clients send and get back -------------------------------------------------------------------
def arr(x: np.ndarray) -> dict:
    x = np.ascontiguousarray(x)
    return {"type": "array", "dtype": str(x.dtype), "shape": list(x.shape), "data": base64.b64encode(x.tobytes()).decode()}


def out_array(data: dict) -> torch.Tensor:
    raw = base64.b64decode(data["data"])
    return torch.from_numpy(np.frombuffer(raw, dtype=data["dtype"]).reshape(data["shape"]).astype(np.float32))


def png_url(image: np.ndarray, kind: str = "image/png") -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return f"data:{kind};base64," + base64.b64encode(buffer.getvalue()).decode()


def mp4_bytes(frames: np.ndarray, fps: int = 4) -> bytes:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for f in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


RNG = np.random.default_rng(0)
FRAMES = RNG.integers(0, 256, (3, 72, 80, 3), dtype=np.uint8)  # non-square: the AC transform crops the centre
VIDEO = RNG.integers(0, 256, (8, 64, 64, 3), dtype=np.uint8)
GOAL = RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8)
ACTIONS = np.concatenate([0.05 * RNG.standard_normal((32, 6)), RNG.uniform(-0.5, 0.5, (32, 1))], 1).astype(np.float32)
STATES = np.concatenate([RNG.standard_normal((32, 6)), RNG.uniform(0, 1, (32, 1))], 1).astype(np.float32)


class Stream:
    """One /v1/generate request streamed in a thread: its output events as they arrive, then the final one."""

    def __init__(self, url: str, body: dict):
        self.events: list[dict] = []
        self.times: list[float] = []  # when each event arrived (time.monotonic)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(url, {**body, "stream": True}), daemon=True)
        self.thread.start()

    def _run(self, url: str, body: dict) -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/generate", json=body, timeout=120) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line:
                        self.events.append(json.loads(line))
                        self.times.append(time.monotonic())
        except BaseException as e:  # reported by result()
            self.error = e

    def wait_for(self, outputs: int) -> None:
        deadline = time.monotonic() + 120
        while sum(e["type"] == "output" for e in self.events) < outputs:
            assert self.thread.is_alive() or self.error is None, self.error
            assert time.monotonic() < deadline, "the stream stalled"
            time.sleep(0.005)

    def result(self) -> list[dict]:
        self.thread.join(120)
        if self.error is not None:
            raise self.error
        assert self.events and self.events[-1]["type"] == "finished", self.events[-1:]
        assert self.events[-1]["finish_reason"] == "stop"
        return [e for e in self.events if e["type"] == "output"]


def rollout_body(c: int, horizon: int, every_state: bool = False, dtype: str = "float32") -> dict:
    states = STATES[: c + horizon - 1] if every_state else STATES[:c]
    return {"task": "rollout", "inputs": {"frames": arr(FRAMES[:c]), "actions": arr(ACTIONS[: c + horizon - 1]),
                                          "states": arr(states)}, "params": {"horizon": horizon, "dtype": dtype}}


SMALL_PLAN = CEMConfig(horizon=2, samples=6, topk=3, iterations=2)


def plan_body(c: int, seed: int, cem: CEMConfig = SMALL_PLAN, features: bool = True) -> dict:
    inputs = {"frames": arr(FRAMES[:c]), "goal": {"type": "image", "url": png_url(GOAL)}, "states": arr(STATES[:c])}
    if c > 1:
        inputs["actions"] = arr(ACTIONS[: c - 1])
    return {"task": "plan", "inputs": inputs, "params": {"horizon": cem.horizon, "samples": cem.samples, "topk": cem.topk,
                                                          "iterations": cem.iterations, "seed": seed,
                                                          "return_features": features}}


# -- the oracles -------------------------------------------------------------------------------------
def ac_features(oracle, frames: np.ndarray) -> torch.Tensor:
    return oracle[0].forward_batch(Batch.of([{"video": torch.from_numpy(frames)}]))[0]["features"]  # [T, F, E]


def want_rollout(oracle, c: int, horizon: int, every_state: bool = False) -> torch.Tensor:
    states = STATES[: c + horizon - 1] if every_state else STATES[:c]
    with torch.inference_mode():
        return official_rollout(oracle[2], ac_features(oracle, FRAMES[:c]), torch.from_numpy(ACTIONS),
                                torch.from_numpy(states), horizon)  # [H, F, E]


def check_rollout(events: list[dict], want: torch.Tensor, tol: dict = TOL) -> None:
    assert [e["iteration"] for e in events] == [[h] for h in range(len(want))]
    got = torch.stack([out_array(e["data"]) for e in events])
    torch.testing.assert_close(got, want, **tol)


def check_plan(oracle, events: list[dict], c: int, seed: int, cem: CEMConfig = SMALL_PLAN, features: bool = True) -> None:
    config = replace(cem, seed=seed)
    feats = ac_features(oracle, FRAMES[:c])
    with torch.inference_mode():
        want = plan(oracle[2], feats, torch.from_numpy(STATES[:c]), ac_features(oracle, GOAL[None])[0], config,
                    actions=torch.from_numpy(ACTIONS[: c - 1]), return_features=features)
    by = {(e["output"], e["iteration"][0]): out_array(e["data"]) for e in events}
    for i in range(config.iterations):  # the cost curve: (best, top-k mean) per CEM iteration
        torch.testing.assert_close(by["cost", i], torch.stack([want.best_cost[i], want.topk_cost[i]]), **TOL)
    last = config.iterations - 1
    torch.testing.assert_close(by["first_action", last], want.first_action, **TOL)
    if features:
        torch.testing.assert_close(by["features", last], want.features, **TOL)


def want_clips(oracle, video: np.ndarray, clip: int) -> list[torch.Tensor]:
    return [oracle[1].forward_batch(Batch.of([{"video": torch.from_numpy(video[i : i + clip].copy())}]))[0]["features"]
            for i in range(0, len(video), clip)]


# -- the tests -----------------------------------------------------------------------------------------
def test_concurrent_mixed_requests_equal_the_offline_oracle(server, oracle):
    """Rollouts of horizon 6, 3, 4 and 1 (C = 2, 1, 1, 3), two plans and an encode, joining mid-flight."""
    long = Stream(server.url, rollout_body(2, 6))
    long.wait_for(1)
    short = Stream(server.url, rollout_body(1, 3))
    plan_one = Stream(server.url, plan_body(1, seed=3))
    short.wait_for(1)
    half = Stream(server.url, rollout_body(1, 4, every_state=True, dtype="float16"))
    plan_two = Stream(server.url, plan_body(2, seed=5))
    encode = Stream(server.url, {"task": "encode", "inputs": {"video": arr(VIDEO)}, "params": {"clip_frames": 4}})
    one = Stream(server.url, rollout_body(3, 1))
    check_rollout(long.result(), want_rollout(oracle, 2, 6))
    check_rollout(short.result(), want_rollout(oracle, 1, 3))
    check_rollout(one.result(), want_rollout(oracle, 3, 1))
    check_rollout(half.result(), want_rollout(oracle, 1, 4, every_state=True), {"atol": 2e-3, "rtol": 2e-3})
    assert {e["data"]["dtype"] for e in half.events if e["type"] == "output"} == {"float16"}
    check_plan(oracle, plan_one.result(), 1, 3)
    check_plan(oracle, plan_two.result(), 2, 5)
    clips = encode.result()
    assert [e["iteration"] for e in clips] == [[0], [1]]  # streamed per clip
    for event, want in zip(clips, want_clips(oracle, VIDEO, 4)):
        torch.testing.assert_close(out_array(event["data"]), want, **TOL)


def test_horizon_30_alone_equals_the_official_loop_and_the_same_beside_others(server, oracle):
    """31 steps (the tiny mask's 32 at most): run alone, not streamed, it is the released loop's rollout; run
    again beside a rollout and a plan, it gives the same frames."""
    body = {**rollout_body(2, 30), "stream": False}
    r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    alone = r.json()["outputs"]
    check_rollout(alone, want_rollout(oracle, 2, 30))
    together = Stream(server.url, rollout_body(2, 30))
    together.wait_for(3)
    others = [Stream(server.url, rollout_body(1, 5)), Stream(server.url, plan_body(1, seed=1))]
    check_rollout(together.result(), torch.stack([out_array(e["data"]) for e in alone]))
    for s in others:
        s.result()


BIG_PLAN = CEMConfig(horizon=2, samples=2048, topk=10, iterations=3)


def test_a_big_plan_leaves_room_for_a_small_rollout_and_both_give_what_they_give_alone(server, oracle):
    """A plan of 2048 candidates (each horizon step a fanned append of 2048 member chunks: 32 engine steps of 64)
    and a horizon-2 rollout sent once the plan's first CEM iteration is out. The fan yields after each engine step
    and leaves half of each step to other requests, so the rollout's steps run between and beside the plan's: it
    ends in a fraction of one CEM iteration. Before, a pass of rank 0 held a whole fanned step (all 32 engine
    steps, every other request's firing waiting), and the rollout took about as long as an iteration. The rollout
    equals the released loop; the plan's first two iterations equal a two-iteration plan served alone (the
    offline ``cem.plan`` of 2048 candidates takes some 20 s; the small plans above check the served one against it)."""
    body = plan_body(1, seed=9, cem=replace(BIG_PLAN, iterations=2), features=False)
    r = httpx.post(f"{server.url}/v1/generate", json={**body, "stream": False}, timeout=120)
    assert r.status_code == 200, r.text
    alone = {(e["output"], e["iteration"][0]): out_array(e["data"]) for e in r.json()["outputs"]}
    big = Stream(server.url, plan_body(1, seed=9, cem=BIG_PLAN, features=False))
    big.wait_for(2)  # iteration 0's cost and first action: the plan is in iteration 1 now
    start = time.monotonic()
    small = Stream(server.url, rollout_body(1, 2))
    check_rollout(small.result(), want_rollout(oracle, 1, 2))
    small_s = small.times[-1] - start
    together = {(e["output"], e["iteration"][0]): out_array(e["data"]) for e in big.result()}
    for key, want in alone.items():
        torch.testing.assert_close(together[key], want, **TOL)
    iteration_s = big.times[5] - big.times[3]  # the last iteration, with nothing beside it
    assert small_s < 0.4 * iteration_s, (small_s, iteration_s)


def test_video_inputs_frames_url_and_file(server, oracle):
    frames_url = "data:video/png;base64," + ",".join(png_url(f).split(",", 1)[1] for f in VIDEO[:4])
    mp4 = mp4_bytes(VIDEO)
    file_url = "data:video/mp4;base64," + base64.b64encode(mp4).decode()
    for url, video in ((frames_url, VIDEO[:4]), (file_url, None)):
        body = {"task": "encode", "inputs": {"video": {"type": "video", "url": url}}, "stream": False}
        r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        if video is None:  # the decoded file, decoded the same way
            video = np.frombuffer(decode_video_file(mp4, "video").data, np.uint8).reshape(8, 64, 64, 3)
        outputs = r.json()["outputs"]
        want = want_clips(oracle, video, 4 if len(video) == 4 else 64)
        assert len(outputs) == len(want)
        for event, w in zip(outputs, want):
            torch.testing.assert_close(out_array(event["data"]), w, **TOL)


def test_rollout_frames_as_image_parts_or_one_frames_url_give_the_same_prediction(server, oracle):
    """Context frames as a list of image parts (as chat and embeddings take several images) or as one video part
    holding them comma-joined: the same frames, the same rollout, equal to the offline oracle."""
    c, horizon = 2, 2
    parts = [{"type": "image", "url": png_url(f)} for f in FRAMES[:c]]
    joined = {"type": "video", "url": "data:video/png;base64," + ",".join(png_url(f).split(",", 1)[1] for f in FRAMES[:c])}
    want = want_rollout(oracle, c, horizon)
    for frames in (parts, joined):
        body = rollout_body(c, horizon)
        body["inputs"]["frames"] = frames
        r = httpx.post(f"{server.url}/v1/generate", json={**body, "stream": False}, timeout=120)
        assert r.status_code == 200, r.text[:300]
        got = torch.stack([out_array(e["data"]) for e in r.json()["outputs"]])
        torch.testing.assert_close(got, want, **TOL)


def test_encode_without_resizing_keeps_the_frames_own_grid(server, ac_dir):
    """``resize: false``: a 48x80 clip (3 x 5 patches) is encoded as given, 2 x 15 tokens, as the encoder runs it."""
    frames = RNG.integers(0, 256, (4, 48, 80, 3), dtype=np.uint8)
    body = {"task": "encode", "inputs": {"video": arr(frames)}, "params": {"resize": False}, "stream": False}
    r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = out_array(r.json()["outputs"][0]["data"])
    encoder = load_encoder(ac_dir)
    with torch.inference_mode():
        want = encoder(as_given_pixels(torch.from_numpy(frames))[None])[0]  # [30, E]
    assert got.shape == (30, 128)
    torch.testing.assert_close(got, want, **TOL)


def test_embeddings_through_the_openai_client(server, oracle):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    inputs = [{"type": "image", "url": png_url(GOAL)}, arr(VIDEO)]
    got = client.embeddings.create(model="tiny-vjepa2-ac", input=inputs, extra_body={"params": {"clip_frames": 4}})
    image = want_clips(oracle, GOAL[None], 4)[0].mean(0)
    video = torch.stack([c.mean(0) for c in want_clips(oracle, VIDEO, 4)]).mean(0)
    assert [d.index for d in got.data] == [0, 1]
    for d, want in zip(got.data, (image, video)):
        torch.testing.assert_close(torch.tensor(d.embedding), want, **TOL)
    r = httpx.post(f"{server.url}/v1/embeddings", json={"input": arr(VIDEO[:2]), "encoding_format": "float"}, timeout=60)
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == image.numel()
    r = httpx.post(f"{server.url}/v1/embeddings", json={"input": "a sentence"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


BAD = [
    ("horizon beyond the mask", rollout_body(1, 3) | {"params": {"horizon": 40}}, "horizon", "built for 32"),
    ("actions of 6 dims", {"task": "rollout", "inputs": {"frames": arr(FRAMES[:1]), "actions": arr(ACTIONS[:3, :6]),
                                                          "states": arr(STATES[:1])}, "params": {"horizon": 3}},
     "actions", "[T, 7]"),
    ("integer actions", {"task": "rollout", "inputs": {"frames": arr(FRAMES[:1]),
                                                        "actions": arr(ACTIONS[:3].astype(np.int32)),
                                                        "states": arr(STATES[:1])}, "params": {"horizon": 3}},
     "actions", "float array"),
    ("too few actions", rollout_body(2, 3) | {"params": {"horizon": 5}}, "actions", "must have 6 rows"),
    ("a NaN action", {"task": "rollout", "inputs": {"frames": arr(FRAMES[:1]),
                                                     "actions": arr(np.where(np.eye(3, 7) > 0, np.nan, ACTIONS[:3])),
                                                     "states": arr(STATES[:1])}, "params": {"horizon": 3}},
     "actions", "finite"),
    ("an infinite float16 state", plan_body(1, 0) | {"inputs": {
        **plan_body(1, 0)["inputs"], "states": arr(np.full((1, 7), np.inf, np.float16))}}, "states", "finite"),
    ("odd frame count", {"task": "encode", "inputs": {"video": arr(VIDEO[:3])}}, "video", "multiple of the tubelet"),
    ("non-square, no resize", rollout_body(1, 2) | {"params": {"horizon": 2, "resize": False}}, "frames", "64x64"),
    ("topk above samples", plan_body(1, 0) | {"params": {"samples": 4, "topk": 5}}, "topk", "topk"),
    ("a goal of two frames", plan_body(1, 0) | {"inputs": {**plan_body(1, 0)["inputs"], "goal": arr(VIDEO[:2])}},
     "goal", "one image"),
    ("an unknown parameter", rollout_body(1, 2) | {"params": {"horizon": 2, "horizn": 3}}, "horizn", "horizn"),
    ("an unknown input", rollout_body(1, 2) | {"inputs": {**rollout_body(1, 2)["inputs"], "action": arr(ACTIONS[:2])}},
     "action", "unknown input 'action'"),
    ("image parts of two sizes", rollout_body(2, 2) | {"inputs": {**rollout_body(2, 2)["inputs"], "frames": [
        {"type": "image", "url": png_url(FRAMES[0])}, {"type": "image", "url": png_url(GOAL)}]}},
     "frames[1]", "80x72"),
    ("predict on an AC checkpoint", {"task": "predict", "inputs": {"video": arr(VIDEO[:2]), "target_ids": [0, 1]}},
     "task", "has no masked predictor"),
]


@pytest.mark.parametrize("name, body, param, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_400_naming_the_field(server, name, body, param, message):
    r = httpx.post(f"{server.url}/v1/generate", json={**body, "stream": False}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].removeprefix("params.").removeprefix("inputs.") == param, error
    assert message in error["message"], error
