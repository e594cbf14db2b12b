"""The vjepa2 family as the server starts it: detection from config.json, ``walkserve tiny``, the walks an
encoder-only and an AC checkpoint serve, the shipped placements, and the memory check with the release's
real sizes read from a checkpoint of safetensors headers only (no weights)."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
import yaml

from walkserve.cli.main import main
from walkserve.cli.serve_banner import routes_for
from walkserve.cli.serve_target import resolve_target
from walkserve.core.errors import ConfigError, InvalidRequest, PlacementError
from walkserve.core.sampling import SamplingParams
from walkserve.models.base import ModelRef
from walkserve.models.common.checkpoint import expected_shapes
from walkserve.models.registry import load_model
from walkserve.models.vjepa2.ac_predictor import IGNORED, ACPredictor
from walkserve.models.vjepa2.config import (
    AC_PREDICTOR,
    ENCODER_PRESETS,
    EncoderConfig,
    VJEPA2ACConfig,
)
from walkserve.models.vjepa2.encoder import VisionEncoder
from walkserve.models.vjepa2.model import VJEPA2
from walkserve.models.vjepa2.tiny import write_tiny_vjepa2, write_tiny_vjepa2_ac
from walkserve.placement.plan import load_placement, parse_placement
from walkserve.placement.resolve import check_placement
from walkserve.placements import path as placement_path

GIB = 2**30


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vjepa2_family")
    return write_tiny_vjepa2(root / "hf", seed=1), write_tiny_vjepa2_ac(root / "ac", seed=2)


def test_serve_detects_the_family_and_tiny_says_how_to_serve(dirs, tmp_path, capsys):
    for d in dirs:
        target = resolve_target(None, str(d), None)
        assert (target.family, target.detected) == ("vjepa2", True)
    assert main(["tiny", "vjepa2-ac", str(tmp_path / "ac")]) == 0
    assert f"walkserve serve vjepa2 --model-path {tmp_path / 'ac'}" in capsys.readouterr().out
    assert main(["tiny", "vjepa2", str(tmp_path / "hf")]) == 0
    assert "walkserve serve vjepa2 --model-path" in capsys.readouterr().out
    tiny = VJEPA2(ModelRef("vjepa2", str(tmp_path / "hf")))  # the HF layout with its masked predictor
    assert tiny.has_masked_predictor and "predict" in tiny.graph().walks


def _check(model: VJEPA2, placement) -> None:
    specs = model.components()
    check_placement(placement, model.graph(), {c for c, s in specs.items() if s.stateful},
                    {c: s.weight_bytes or 0 for c, s in specs.items()}, {c: s.state_bytes or 0 for c, s in specs.items()})


def test_walks_and_shipped_placements_per_checkpoint(dirs):
    hf, ac = (load_model(ModelRef("vjepa2", str(d))) for d in dirs)
    assert list(hf.graph().walks) == ["encode", "predict"] and set(hf.components()) == {"encoder", "masked_predictor"}
    assert list(ac.graph().walks) == ["encode", "rollout", "plan_history", "plan", "plan_features"]
    assert set(ac.components()) == {"encoder", "predictor", "stepper", "planner"}
    assert ac.components()["predictor"].options["block_size"] == 18  # one block per step: 2 + 16 tokens
    _check(hf, load_placement(placement_path("vjepa2")))
    for name in ("vjepa2-ac", "vjepa2-ac-split"):
        _check(ac, load_placement(placement_path(name)))
    with pytest.raises(PlacementError, match="unknown node"):  # the AC placement names nodes an encoder lacks
        _check(hf, load_placement(placement_path("vjepa2-ac")))
    card = hf.processor().card()
    assert {"encode", "embeddings", "predict"} <= card.capabilities and "rollout" not in card.capabilities
    assert {"POST /v1/generate", "POST /v1/embeddings"} <= set(routes_for(card))  # the banner of walkserve serve
    assert "POST /v1/chat/completions" not in routes_for(ac.processor().card())
    with pytest.raises(InvalidRequest) as e:
        hf.processor().build_request("rollout", {"inputs": {}}, SamplingParams(), hf.processor().check_params({}))
    assert e.value.param == "task" and "V-JEPA 2-AC checkpoint" in str(e.value)
    with pytest.raises(InvalidRequest, match="has no masked predictor") as e:
        ac.processor().build_request("predict", {"inputs": {}}, SamplingParams(), ac.processor().check_params({}))
    assert e.value.param == "task" and "predict" not in ac.processor().card().capabilities


def test_an_hf_checkpoint_without_its_predictor_serves_encode_only(dirs, tmp_path):
    """No predictor.* tensors: no predict walk, a 400 saying why, and the shipped vjepa2 placement (which places
    the masked predictor) refused at start with a message naming it; a placement of the encoder alone also turns
    predict off on a full checkpoint."""
    from safetensors.torch import load_file, save_file

    bare = tmp_path / "encoder-only"
    bare.mkdir()
    (bare / "config.json").write_text((dirs[0] / "config.json").read_text())
    tensors = load_file(dirs[0] / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k.startswith("encoder.")}, bare / "model.safetensors")
    model = load_model(ModelRef("vjepa2", str(bare)))
    assert list(model.graph().walks) == ["encode"] and set(model.components()) == {"encoder"}
    _check(model, parse_placement(model.default_placement(), "default"))
    with pytest.raises(ConfigError, match="places the masked predictor, but this checkpoint has none"):
        model.for_placement(yaml.safe_load(placement_path("vjepa2").read_text()))
    with pytest.raises(InvalidRequest, match="no masked predictor") as e:
        model.processor().build_request("predict", {"inputs": {}}, SamplingParams(), model.processor().check_params({}))
    assert e.value.param == "task" and "no predictor.* tensors" in model.processor().card().unsupported["predict"]
    full = load_model(ModelRef("vjepa2", str(dirs[0])))
    encoder_only = full.for_placement({"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["encoder"],
                                                                                         "ranks": [0]}]})
    assert list(encoder_only.graph().walks) == ["encode"] and "predict" not in encoder_only.processor().card().capabilities


# -- the release's sizes -------------------------------------------------------------------------------
def write_release_headers(directory) -> None:
    """config.json of a converted vjepa2-ac-vitg.pt and one header-only F32 safetensors file of its tensors."""
    config = VJEPA2ACConfig(EncoderConfig(ENCODER_PRESETS["vitg"], crop_size=256), AC_PREDICTOR,
                            source="vjepa2-ac-vitg.pt")
    with torch.device("meta"):
        shapes = {**expected_shapes(VisionEncoder(config.encoder), "encoder."),
                  **expected_shapes(ACPredictor(config.predictor), "predictor.")}
    shapes["predictor." + IGNORED[0]], shapes["predictor." + IGNORED[1]] = (1024, 6), (1024,)
    header, offset = {}, 0
    for name, shape in sorted(shapes.items()):
        size = math.prod(shape) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob)
    (directory / "config.json").write_text(json.dumps(config.to_dict()))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    directory = tmp_path_factory.mktemp("release") / "vjepa2-ac-vitg"
    directory.mkdir()
    write_release_headers(directory)
    return VJEPA2(ModelRef("vjepa2", str(directory)))


def _placement(devices: list[str], split: bool, memory: str | None = None):
    ranks = [{"id": i, "device": d, **({"memory": memory} if memory else {})} for i, d in enumerate(devices)]
    base = load_placement(placement_path("vjepa2-ac-split" if split else "vjepa2-ac"))
    nodes = [{"nodes": sorted({n for (_, n), r in base.entries.items() if r == (rank,)}), "ranks": [rank]}
             for rank in sorted({r for rs in base.entries.values() for r in rs})]
    return parse_placement({"ranks": ranks, "nodes": nodes}, "test-placement")


def test_the_release_sizes_from_headers(release):
    specs = release.components()
    assert specs["encoder"].weight_bytes == 1_012_173_952 * 4  # ViT-g: 1.01 B parameters
    assert specs["predictor"].weight_bytes == (305_213_824 + 1024 * 7) * 4  # with the unused extrinsics encoder
    lines = release.memory_report(_placement(["cuda:0"], split=False), device_memory=lambda d: 80 * GIB)
    assert lines[0] == "checkpoint vjepa2-ac-vitg: 4.91 GiB as stored (float32)"
    assert lines[1].startswith("rank 0 (cuda:0, 80.00 GiB): weights 4.91 GiB = encoder 3.77 GiB + predictor 1.14 GiB; "
                               "KV 192.0 KiB per token (float32) = 48.4 MiB per step, pool ")
    split = release.memory_report(_placement(["cuda:0", "cuda:1"], split=True, memory="40GiB"))
    assert "weights 1.14 GiB = predictor 1.14 GiB; KV 192.0 KiB" in split[1]
    assert "weights 3.77 GiB = encoder 3.77 GiB; total 3.77 GiB" in split[2]


def test_a_rank_too_small_is_refused_with_the_numbers(release):
    with pytest.raises(PlacementError, match=r"does not fit: rank 0 \(cuda:0, 4.50 GiB\): weights 4.91 GiB.*over the "
                                             r"budget of 4.50 GiB"):
        release.memory_report(_placement(["cuda:0"], split=False, memory="4.5GiB"))
    steps = VJEPA2(ModelRef("vjepa2", str(release.path), {"kv": {"num_blocks": 1000}}))  # 1000 steps of 48.4 MiB
    with pytest.raises(PlacementError, match=r"pool 47.24 GiB = 1,000 steps; total 48.38 GiB, over the budget of "
                                             r"40.00 GiB by 8.38 GiB"):
        steps.memory_report(_placement(["cuda:0", "cuda:1"], split=True, memory="40GiB"))
