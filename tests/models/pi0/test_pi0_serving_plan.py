"""Serving pi0 / pi0.5 without processes: walks, shipped placements, the KV share check, memory with the real
sizes, the processor's requests and errors, openpi's frame codec, and the CLI's family detection."""

from __future__ import annotations

import io
import json
import math
import struct

import numpy as np
import pytest
import torch

import walkserve.placements
from walkserve.api.openpi.codec import FrameError, decode, encode
from walkserve.core.errors import ConfigError, InvalidRequest, PlacementError
from walkserve.core.sampling import SamplingParams
from walkserve.models.base import ModelRef
from walkserve.models.pi0.inputs import validate_inputs
from walkserve.models.pi0.model import RobotPolicy
from walkserve.models.pi0.predict import prefix_context
from walkserve.models.pi0.request import image_digest, prepare_request
from walkserve.models.pi0.sizes import component_bytes
from walkserve.models.pi0.vision import unpack_images
from walkserve.placement.plan import load_placement, parse_placement
from walkserve.placement.resolve import check_placement

GiB = 2**30


def _check(model: RobotPolicy, placement, free: int | None = None) -> None:
    comps = model.components()
    check_placement(placement, model.graph(), {c for c, s in comps.items() if s.stateful},
                    {c: s.weight_bytes for c, s in comps.items()}, {c: s.state_bytes for c, s in comps.items()},
                    device_free=lambda device: free, kv_shares={c: s.kv_share for c, s in comps.items() if s.kv_share})


@pytest.fixture(scope="module")
def models(tiny_pi0, tiny_pi05):
    return {t.kind: RobotPolicy(ModelRef(t.kind, str(t.path))) for t in (tiny_pi0, tiny_pi05)}


def test_walks_and_nodes(models):
    for kind, model in models.items():
        graph = model.graph()
        assert set(graph.plans) == {"prefix", "act"}
        extra = {"state_embed", "state_token"} if kind == "pi0" else set()
        assert set(graph.node_names()) == {"vision", "lm", "flow_start", "expert", "flow_step", "actions"} | extra
        comps = model.components()
        assert comps["lm"].kv_share == comps["expert"].kv_share == "paligemma"
        assert comps["expert"].state_bytes == 0 and callable(comps["lm"].state_bytes)  # one pool, counted once


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_shipped_split_placement_and_the_default_fit(models, kind):
    model = models[kind]
    place = load_placement(walkserve.placements.path(f"{kind}-split"))
    _check(model, place)
    assert place.ranks_for("prefix", "vision") == (1,) and place.ranks_for("act", "expert") == (0,)
    _check(model, parse_placement(model.default_placement(), "default"))


def test_separating_the_expert_from_paligemma_is_refused(models):
    model = models["pi05"]
    data = {"ranks": [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}],
            "nodes": [{"nodes": ["vision", "lm", "flow_start", "flow_step", "actions"], "ranks": [0]},
                      {"nodes": ["expert"], "ranks": [1]}]}
    with pytest.raises(PlacementError, match=r"components 'lm' and 'expert' share KV contexts \(kv_share 'paligemma'\)"):
        _check(model, parse_placement(data, "split.yaml"))


def _real_size_checkpoint(kind: str, tiny_dir, out):
    """config.json of the real variant (gemma_2b / gemma_300m / So400m at 224) and a header-only safetensors
    file with every tensor lerobot's release has, at its real shape (fp32)."""
    from walkserve.models.common.checkpoint import checkpoint_targets
    from walkserve.models.pi0.config import PolicyConfig
    from walkserve.models.pi0.policy import Pi0Policy, checkpoint_name

    raw = json.loads((tiny_dir / "config.json").read_text())
    raw.pop("walkserve_sizes")
    raw["image_resolution"] = [224, 224]
    out.mkdir()
    (out / "config.json").write_text(json.dumps(raw))
    with torch.device("meta"):
        policy = Pi0Policy(PolicyConfig.from_dict(raw))
    params = dict(policy.named_parameters())
    header, offset = {}, 0
    for own, target in checkpoint_targets(policy).items():
        shape = list(params[target.param][target.index].shape)
        header[f"model.{checkpoint_name(own)}"] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * math.prod(shape)]}
        offset += 4 * math.prod(shape)
    blob = json.dumps(header).encode()
    (out / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob)
    for file in tiny_dir.iterdir():  # the normaliser statistics and a tokenizer, so the model loads
        if file.name not in ("config.json", "model.safetensors"):
            (out / file.name).write_bytes(file.read_bytes())
    return sum(p.numel() for p in policy.parameters()) * 4, out


def test_memory_check_with_the_real_sizes(tiny_pi05, tmp_path):
    total, path = _real_size_checkpoint("pi05", tiny_pi05.path, tmp_path / "pi05_base")
    sizes = component_bytes(path)
    assert sizes["vision"] + sizes["lm"] + sizes["expert"] == total  # every parameter once (flow head: a copy)
    assert 9.3 * GiB < sizes["lm"] < 9.4 * GiB and 1.5 * GiB < sizes["vision"] < 1.6 * GiB
    assert 1.5 * GiB < sizes["expert"] < 1.7 * GiB  # gemma_300m with pi0.5's adaRMS dense norms
    assert component_bytes(path, "bfloat16")["lm"] == sizes["lm"] // 2
    model = RobotPolicy(ModelRef("pi05", str(path)))
    two_gpus = load_placement(walkserve.placements.path("pi05-two-gpus"))
    _check(model, two_gpus, free=60 * GiB)  # fits: ~11 GiB of weights + half the free memory for the KV pool
    small = {"ranks": [{"id": 0, "device": "cuda:0", "memory": "8GiB"}],
             "nodes": [{"nodes": model.graph().node_names(), "ranks": [0]}]}
    with pytest.raises(PlacementError, match=r"rank 0 \(cuda:0\) needs 1[0-9.]+ GiB .*but has a budget of 8.00 GiB"):
        _check(model, parse_placement(small, "small.yaml"), free=4 * GiB)


def _png(height: int, width: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _inputs(**over):
    rng = np.random.default_rng(0)
    base = {"base_0_rgb": rng.integers(0, 256, (20, 30, 3), dtype=np.uint8), "state": np.linspace(-1, 1, 8),
            "prompt": "stack the cups"}
    return {k: v for k, v in {**base, **over}.items() if v is not None}


@pytest.mark.parametrize(("change", "param", "code"), [
    ({"base_0_rgb": None}, "inputs.base_0_rgb", "missing_input"),
    ({"state": None}, "inputs.state", "missing_input"),
    ({"state": np.zeros(7)}, "inputs.state", "invalid_shape"),
    ({"noise": np.zeros((3, 32))}, "inputs.noise", "invalid_shape"),
    ({"base_0_rgb": np.zeros((5, 5))}, "inputs.base_0_rgb", "invalid_image"),
    ({"left_wrist_0_rgb": b"not an image"}, "inputs.left_wrist_0_rgb", "invalid_image"),
    ({"left_wrist_0_rgb": _png(2049, 2049)}, "inputs.left_wrist_0_rgb", "image_too_large"),
    ({"prompt": "go " * 200}, "inputs.prompt", "prompt_too_long"),
    ({"elbow_cam": np.zeros((4, 4, 3), np.uint8)}, "inputs.elbow_cam", None),
])
def test_bad_inputs_name_the_field(models, change, param, code):
    proc = models["pi05"].processor()
    with pytest.raises(InvalidRequest) as e:
        proc.build_request("act", {"inputs": _inputs(**change)}, SamplingParams(), proc.check_params({}))
    assert e.value.param == param and (code is None or e.value.code == code), (e.value.param, e.value.code, str(e.value))


def test_openpi_observations_map_and_their_errors_name_the_observation_key(models):
    proc = models["pi0"].processor()
    img = np.zeros((18, 32, 3), dtype=np.uint8)
    droid = {"observation/exterior_image_1_left": img, "observation/wrist_image_left": img,
             "observation/joint_position": np.zeros(7), "observation/gripper_position": np.zeros(1), "prompt": "wipe"}
    spec = proc.build_request("act", {"observation": droid}, SamplingParams(), proc.check_params({"seed": 3}))
    assert spec.task == "act" and spec.modalities == ("action",)
    assert spec.inputs["image_shapes"].shape == (2, 2) and spec.inputs["state"].shape == (32,)
    again = proc.build_request("act", {"observation": droid}, SamplingParams(), proc.check_params({"seed": 3}))
    assert again.inputs["noise"].data == spec.inputs["noise"].data  # seeded noise is reproducible
    by_sampling = proc.build_request("act", {"observation": droid}, SamplingParams(seed=3), proc.check_params({}))
    assert by_sampling.inputs["noise"].data == spec.inputs["noise"].data  # the sampling seed, when params has none
    with pytest.raises(InvalidRequest) as e:
        proc.build_request("act", {"observation": {**droid, "observation/joint_position": np.zeros(6)}}, SamplingParams(), proc.check_params({}))
    assert e.value.param == "observation/joint_position + observation/gripper_position"
    libero = {"observation/image": np.zeros((4, 4, 3), np.float32) + 2.0, "observation/state": np.zeros(8), "prompt": "p"}
    with pytest.raises(InvalidRequest) as e:
        proc.build_request("act", {"observation": libero}, SamplingParams(), proc.check_params({}))
    assert (e.value.param, e.value.code) == ("observation/image", "invalid_image")
    with pytest.raises(InvalidRequest, match="task 'act'"):
        proc.build_request("generate", {"inputs": _inputs()}, SamplingParams(), proc.check_params({}))


def test_walk_inputs_lay_out_the_prefix(models, tiny_pi0):
    """The walk inputs hold what the offline oracle consumes: the same prefix K/V from the same ids and images."""
    proc = models["pi0"].processor()
    raw = _inputs(left_wrist_0_rgb=np.full((28, 28, 3), 0.25, np.float32), noise=np.zeros((10, 32), np.float32))
    spec = proc.build_request("act", {"inputs": raw}, SamplingParams(), proc.check_params({}))
    prepared = prepare_request(proc.files, validate_inputs(proc.spec, raw))
    tokens = np.frombuffer(spec.inputs["tokens"].data, dtype=np.int64)
    per_image = tiny_pi0.policy.config.image_tokens
    assert tokens[: 2 * per_image].tolist() == [0] * (2 * per_image) and tokens[2 * per_image:].tolist() == prepared.token_ids
    assert np.frombuffer(spec.inputs["embed_rows"].data, dtype=np.int64).tolist() == list(range(2 * per_image))
    content = np.frombuffer(spec.inputs["content"].data, dtype=np.int64)  # the prefix cache's keys: a digest per camera
    assert spec.inputs["content"].shape == (2 * per_image + len(prepared.token_ids), 2)  # 128 bits a row
    digests = [image_digest(raw["base_0_rgb"]), image_digest(raw["left_wrist_0_rgb"])]
    rows = [tuple(r) for r in content.reshape(-1, 2).tolist()]
    assert rows == [digests[0]] * per_image + [digests[1]] * per_image + [(0, 0)] * len(prepared.token_ids)
    assert (0, 0) not in digests and digests[0] != digests[1]
    other = raw["base_0_rgb"].copy()
    other[3, 4, 1] ^= 1  # one pixel
    assert image_digest(other) != digests[0] and image_digest(raw["base_0_rgb"].copy()) == digests[0]
    assert image_digest(raw["base_0_rgb"].reshape(30, 20, 3)) != digests[0]  # the same bytes in another shape
    assert spec.inputs["images"].dtype == "float32"  # one float camera: both sent as floats in [0, 1]
    images = unpack_images({k: torch.frombuffer(bytearray(spec.inputs[k].data), dtype=getattr(torch, spec.inputs[k].dtype))
                            for k in ("images", "image_shapes")})
    assert [tuple(i.shape) for i in images] == [(20, 30, 3), (28, 28, 3)]
    torch.testing.assert_close(images[0], torch.from_numpy(raw["base_0_rgb"]).float() / 255.0, rtol=0, atol=0)
    assert prefix_context(tiny_pi0.policy, prepared).next_position == tokens.size + 1  # + pi0's state token


def test_openpi_frames(tmp_path):
    from openpi_client import msgpack_numpy

    obs = {"observation/image": np.arange(24, dtype=np.uint8).reshape(2, 4, 3), "observation/state": np.ones(8),
           "prompt": "open the drawer", "t": np.float32(0.5)}
    got = decode(msgpack_numpy.packb(obs))
    assert got["prompt"] == "open the drawer" and got["t"] == np.float32(0.5)
    np.testing.assert_array_equal(got["observation/image"], obs["observation/image"])
    answer = msgpack_numpy.unpackb(encode({"actions": np.eye(3, dtype=np.float32), "server_timing": {"infer_ms": 1.0}}))
    np.testing.assert_array_equal(answer["actions"], np.eye(3, dtype=np.float32))
    import msgspec

    for bad, where in [({"x": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "O", b"shape": [1]}}, "x"),
                       ({"x": {b"__ndarray__": True, b"data": b"\0" * 3, b"dtype": "<f4", b"shape": [1]}}, "x"),
                       ({"x": {"y": {b"__ndarray__": True, b"data": b"", b"dtype": "V8", b"shape": [0]}}}, "x.y")]:
        with pytest.raises(FrameError) as e:
            decode(msgspec.msgpack.encode(bad))
        assert e.value.where == where
    with pytest.raises(FrameError, match="not a msgpack frame"):
        decode(b"\xc1")


def test_serve_detects_the_family_and_takes_the_tokenizer(tiny_pi05, tmp_path):
    from walkserve.cli.serve_target import resolve_target

    target = resolve_target(None, str(tiny_pi05.path), None, tokenizer_path=str(tiny_pi05.path / "tokenizer.model"))
    assert target.family == "pi05" and target.detected and target.options["tokenizer_path"].endswith("tokenizer.model")
    with pytest.raises(ConfigError, match="--tokenizer-path .*no such file"):
        resolve_target(None, str(tiny_pi05.path), None, tokenizer_path=str(tmp_path / "absent.model"))
    with pytest.raises(ConfigError, match="holds a pi05 checkpoint"):
        RobotPolicy(ModelRef("pi0", str(tiny_pi05.path)))
