"""The ``predict`` task served over HTTP (an HF-layout checkpoint: encoder + masked predictor) against
transformers' ``VJEPA2Model`` predictor path on the same tiny weights.

One server per module on the shipped ``vjepa2`` placement, over ``write_tiny_vjepa2`` (64² crops, grid 4:
16 tokens a tubelet, frames_per_clip 4). Predict requests with different clips and masks (and an encode of
two clips) run concurrently, the predicts joining while the encode is mid-flight; each predicted target
block must equal ``VJEPA2Model(pixels, context_mask, target_mask).predictor_output`` (<= 1e-4), where the
pixels are our evaluation transform (itself tested in test_vjepa2_encoder.py). Bad masks and clips are a
400 naming the field.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from tests.api.real_server import in_thread_server
from tests.models.vjepa2.test_serving import Stream, arr, out_array
from walkserve.core.config import RuntimeConfig
from walkserve.models.vjepa2.preprocess import video_pixels
from walkserve.placements import path as placement_path

pytestmark = [pytest.mark.slow]
TOL = {"atol": 1e-4, "rtol": 1e-4}
RNG = np.random.default_rng(7)
CLIP = RNG.integers(0, 256, (4, 72, 88, 3), dtype=np.uint8)  # resized and center-cropped to 64²
IMAGE = RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def server(hf_dir):
    with in_thread_server("vjepa2", hf_dir, RuntimeConfig(max_running=16),
                          placement=str(placement_path("vjepa2"))) as s:
        yield s


@pytest.fixture(scope="module")
def hf(hf_dir):
    from transformers import VJEPA2Model

    torch.set_num_threads(1)
    return VJEPA2Model.from_pretrained(hf_dir, attn_implementation="eager").eval()


def hf_pixels(frames: np.ndarray) -> torch.Tensor:
    """Our evaluation transform in transformers' layout [1, T, 3, 64, 64] (an image: one tubelet of it)."""
    pixels = video_pixels(torch.from_numpy(frames if frames.ndim == 4 else frames[None]), 64)  # [3, T, 64, 64]
    if pixels.shape[1] == 1:
        pixels = pixels.expand(-1, 2, -1, -1)
    return pixels.permute(1, 0, 2, 3)[None]


def want_predicted(hf, frames: np.ndarray, context: list[int], target: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        out = hf(hf_pixels(frames), context_mask=[torch.tensor([context])], target_mask=[torch.tensor([target])])
    return out.predictor_output.last_hidden_state[0]  # [Nt, 128], in target order


def predict_body(frames: np.ndarray, target: list[int], context: list[int] | None = None, **params) -> dict:
    inputs = {"video": arr(frames), "target_ids": target, **({"context_ids": context} if context else {})}
    return {"task": "predict", "inputs": inputs, "params": params}


def test_concurrent_predicts_equal_transformers(server, hf):
    encode = Stream(server.url, {"task": "encode", "inputs": {"video": arr(CLIP)}, "params": {"clip_frames": 2}})
    encode.wait_for(1)
    cases = [  # (frames, context, target): unsorted indices spanning both tubelets; same (Nc, Nt) run as one batch
        (CLIP, [0, 3, 5, 7, 9, 11, 13, 20, 25, 30], [31, 1, 2, 4, 6, 8, 17, 18, 19]),
        (CLIP, [16, 17, 18, 19, 20, 21, 22, 23, 24, 2], [0, 1, 5, 9, 13, 27, 28, 29, 30]),
        (CLIP[:2], None, [5, 6, 9, 10]),  # context: every other token of the one tubelet
        (IMAGE, [0, 1, 2, 3, 12, 13, 14, 15], [6, 5]),
    ]
    streams = [Stream(server.url, predict_body(f, t, c)) for f, c, t in cases]
    half = Stream(server.url, predict_body(CLIP, cases[0][2], cases[0][1], dtype="float16"))
    for s, (frames, context, target) in zip(streams, cases):
        context = context or sorted(set(range(16)) - set(target))
        (event,) = s.result()
        assert (event["walk"], event["node"], event["output"]) == ("predict", "masked_predictor", "predicted")
        want = want_predicted(hf, frames, context, target)
        assert event["data"]["shape"] == [len(target), 128] and want.std() > 0.3
        torch.testing.assert_close(out_array(event["data"]), want, **TOL)
    (event,) = half.result()
    assert event["data"]["dtype"] == "float16"
    torch.testing.assert_close(out_array(event["data"]), want_predicted(hf, CLIP, cases[0][1], cases[0][2]),
                               atol=2e-3, rtol=2e-3)
    with torch.inference_mode():
        clips = [hf(hf_pixels(CLIP[i : i + 2]), skip_predictor=True).last_hidden_state[0] for i in (0, 2)]
    for event, want in zip(encode.result(), clips):
        torch.testing.assert_close(out_array(event["data"]), want, **TOL)


def test_predict_not_streamed_and_the_card(server, hf):
    body = {**predict_body(CLIP, [3, 30], [0, 1, 2]), "stream": False}
    r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (output,) = r.json()["outputs"]
    torch.testing.assert_close(out_array(output["data"]), want_predicted(hf, CLIP, [0, 1, 2], [3, 30]), **TOL)
    card = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]
    assert {"encode", "predict", "embeddings"} <= set(card["capabilities"]) and "rollout" not in card["capabilities"]


BAD = [
    ("an index beyond the clip", predict_body(CLIP, [0, 32]), "target_ids", "outside [0, 32)"),
    ("an image has one tubelet", predict_body(IMAGE, [3, 16]), "target_ids", "outside [0, 16)"),
    ("float indices", predict_body(CLIP, [1.5, 2.0]), "target_ids", "integer token indices"),
    ("no target", {"task": "predict", "inputs": {"video": arr(CLIP)}}, "target_ids", "required"),
    ("empty target", predict_body(CLIP, []), "target_ids", "non-empty"),
    ("2-D indices", {"task": "predict", "inputs": {"video": arr(CLIP), "target_ids": arr(np.eye(2, dtype=np.int64))}},
     "target_ids", "shape [2, 2]"),
    ("a repeated index", predict_body(CLIP, [4, 4]), "target_ids", "repeats"),
    ("context overlaps target", predict_body(CLIP, [4, 5], [1, 5]), "context_ids", "share token index 5"),
    ("negative context", predict_body(CLIP, [4, 5], [-1, 2]), "context_ids", "outside"),
    ("no context left", predict_body(CLIP[:2], list(range(16))), "target_ids", "no context"),
    ("odd frame count", predict_body(CLIP[:3], [0]), "video", "multiple of the tubelet"),
    ("more than one clip", predict_body(np.concatenate([CLIP, CLIP[:2]]), [0]), "video", "at most 4"),
    ("not the crop, no resize", predict_body(CLIP, [0], resize=False), "video", "64x64"),
    ("rollout on an encoder", {"task": "rollout", "inputs": {}}, "task", "V-JEPA 2-AC checkpoint"),
]


@pytest.mark.parametrize("name, body, param, message", BAD, ids=[b[0] for b in BAD])
def test_bad_predict_input_is_a_400_naming_the_field(server, name, body, param, message):
    r = httpx.post(f"{server.url}/v1/generate", json={**body, "stream": False}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].removeprefix("params.").removeprefix("inputs.") == param, error
    assert message in error["message"], error
