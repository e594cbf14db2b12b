"""The memory check with the release's real sizes: a checkpoint of safetensors headers only (no weights).

The release's config (next_models.md section 1) gives every tensor's shape (the thinker's from our
modules on the meta device, the talker's and Code2Wav's from their sections); 15 header-only shards
in the release's order carry them. The report reads only those headers.
"""

from __future__ import annotations

import json

import pytest

from walkserve.core.errors import PlacementError
from walkserve.models.base import ModelRef
from walkserve.models.qwen3_omni.memory import shards_of, stored_bytes
from walkserve.models.qwen3_omni.model import Qwen3OmniThinker
from walkserve.models.qwen3_omni.release import release_config, write_headers
from walkserve.placement.plan import parse_placement

GIB = 2**30
_MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20], "interleaved": True}


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    directory = tmp_path_factory.mktemp("release") / "Qwen3-Omni-30B-A3B-Instruct"
    directory.mkdir()
    write_headers(directory, release_config())
    return Qwen3OmniThinker(ModelRef("qwen3-omni", str(directory), {"speech": False}))


def placement(devices: list[str], split: bool, memory: str | None = None) -> object:
    ranks = [{"id": i, "device": d, **({"memory": memory} if memory else {})} for i, d in enumerate(devices)]
    nodes = ([{"nodes": ["thinker"], "ranks": [0]}, {"nodes": ["audio_encoder", "vision_encoder"], "ranks": [1]}]
             if split else [{"nodes": ["thinker", "audio_encoder", "vision_encoder"], "ranks": [0]}])
    return parse_placement({"ranks": ranks, "nodes": nodes}, "test-placement")


def test_the_release_sizes_from_headers(release):
    sizes = stored_bytes(release.path)
    n_tensors = sum(len(json.loads(p.read_bytes()[8:])) for p in release.path.glob("*.safetensors"))
    assert n_tensors == 28010  # the release's tensor count
    assert sum(sizes.values()) / 2 == pytest.approx(35.26e9, rel=1e-3)  # 35.26 B parameters
    assert sum(sizes.values()) / GIB == pytest.approx(65.68, abs=0.01)  # GiB, not GB (70.5 GB)
    thinker = sizes["thinker"] + sizes["audio_encoder"] + sizes["vision_encoder"]
    assert thinker / GIB == pytest.approx(59.08, abs=0.01)
    assert release.kv_bytes_per_token() == 96 * 1024
    assert len(shards_of(release.path, "thinker.")) == 13  # speech off: the talker / Code2Wav shards stay closed


def test_one_gpu_report_and_refusal(release):
    lines = release.memory_report(placement(["cuda:0"], split=False), device_memory=lambda d: 80 * GIB)
    assert "65.68 GiB as stored" in lines[0] and "59.08 GiB is loaded" in lines[0]
    assert lines[1].startswith("rank 0 (cuda:0, 80.00 GiB): weights 59.08 GiB = audio_encoder 1.21 GiB + thinker 56.87 GiB "
                               "+ vision_encoder 1.00 GiB")
    assert "KV 96.0 KiB per token (bfloat16), pool 10.46 GiB = 114,242 tokens" in lines[1]  # half of what is left
    with pytest.raises(PlacementError) as e:
        release.memory_report(placement(["cuda:0"], split=False, memory="58GiB"))
    assert "does not fit" in str(e.value) and "weights 59.08 GiB" in str(e.value) and "budget of 58.00 GiB" in str(e.value)
    big_pool = Qwen3OmniThinker(ModelRef("qwen3-omni", str(release.path), {"kv": {"kv_bytes": 30 * GIB}, "speech": False}))
    with pytest.raises(PlacementError, match=r"pool 30.00 GiB = 327,680 tokens; total 89.08 GiB.*over the budget "
                                             r"of 80.00 GiB by 9.08 GiB"):
        big_pool.memory_report(placement(["cuda:0"], split=False), device_memory=lambda d: 80 * GIB)


def test_encoders_split_report(release):
    lines = release.memory_report(placement(["cuda:0", "cuda:1"], split=True, memory="80GiB"))
    rank0, rank1 = lines[1], lines[2]
    assert "weights 56.87 GiB = thinker 56.87 GiB" in rank0 and "KV 96.0 KiB per token" in rank0
    assert "audio_encoder 1.21 GiB + vision_encoder 1.00 GiB" in rank1 and "KV" not in rank1
    cpu = release.memory_report(placement(["cpu", "cpu"], split=True))
    assert "pool 0.25 GiB = 2,730 tokens" in cpu[1]  # the CPU default pool


def test_speech_split_report(release):
    """Speech on: rank 1 of qwen3-omni-split holds the talker (with its copy of the thinker's embedding table),
    the code predictor, the glue's codec table and Code2Wav in float32, and their two KV pools."""
    import dataclasses

    from walkserve.placement.plan import load_placement
    from walkserve.placements import path

    speaking = Qwen3OmniThinker(ModelRef("qwen3-omni", str(release.path)))
    place = load_placement(path("qwen3-omni-split"))
    place = dataclasses.replace(place, ranks={r: dataclasses.replace(s, device=f"cuda:{r}") for r, s in place.ranks.items()})
    lines = speaking.memory_report(place, device_memory=lambda d: 80 * GIB)
    assert "the speech half 6.59 GiB are loaded" in lines[0]
    assert "weights 59.08 GiB" in lines[1] and "talker" not in lines[1]
    assert lines[2].startswith("rank 1 (cuda:1, 80.00 GiB): weights 7.64 GiB = code2wav 0.80 GiB + code_predictor "
                               "0.26 GiB + talker 6.57 GiB + talker_glue 0.01 GiB")
    assert "talker pool 0.25 GiB, code_predictor pool 0.06 GiB; total 7.95 GiB" in lines[2]
