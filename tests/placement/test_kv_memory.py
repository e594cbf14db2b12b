"""The memory check counts the KV pool the engine will really allocate: the CPU default, and on CUDA
the engine's share of the device memory left once the weights are loaded (injected here: no GPU)."""

from __future__ import annotations

import pytest

from walkserve.core.errors import PlacementError
from walkserve.models.base import ModelRef
from walkserve.models.llama.model import TextLM
from walkserve.models.llama.tiny import write_tiny
from walkserve.placement import parse_placement
from walkserve.placement.memory import (
    DEFAULT_CPU_KV_BYTES,
    DEFAULT_GPU_MEMORY_FRACTION,
    default_kv_bytes,
)
from walkserve.placement.resolve import check_placement

GIB = 2**30


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> TextLM:
    return TextLM(ModelRef("llama", str(write_tiny("llama", tmp_path_factory.mktemp("kv-memory") / "lm"))))


def _check(model: TextLM, device: str, memory: str, free: int | None) -> None:
    comps = model.components()
    place = parse_placement({"ranks": [{"id": 0, "device": device, "memory": memory}],
                             "nodes": [{"nodes": model.graph().node_names(), "ranks": [0]}]}, "p.yaml")
    check_placement(place, model.graph(), {"lm"}, {c: s.weight_bytes for c, s in comps.items()},
                    {c: s.state_bytes for c, s in comps.items()}, device_free=lambda d: free)


def test_the_default_pool_per_device_kind():
    assert default_kv_bytes("cpu", None) == DEFAULT_CPU_KV_BYTES == 256 * 2**20
    assert default_kv_bytes("cuda:1", 80 * GIB) == int(80 * GIB * DEFAULT_GPU_MEMORY_FRACTION)


def test_a_cpu_rank_counts_the_cpu_default(lm):
    _check(lm, "cpu", "300MiB", None)
    with pytest.raises(PlacementError, match=r"state of lm 0.25 GiB"):
        _check(lm, "cpu", "200MiB", None)


def test_a_cuda_rank_counts_half_the_free_memory_after_the_weights(lm):
    weights = lm.components()["lm"].weight_bytes
    _check(lm, "cuda:0", "64GiB", 80 * GIB)  # 40 GiB of KV + tiny weights fit 64 GiB
    with pytest.raises(PlacementError) as err:
        _check(lm, "cuda:0", "16GiB", 80 * GIB)  # the 256 MiB CPU default would have fit: the engine takes 40 GiB
    kv = default_kv_bytes("cuda:0", 80 * GIB - weights)
    assert f"state of lm {kv / GIB:.2f} GiB" in str(err.value) and "cuda:0" in str(err.value)


def test_an_explicit_pool_size_is_counted_as_given(tmp_path):
    path = write_tiny("llama", tmp_path / "lm")
    model = TextLM(ModelRef("llama", str(path), {"kv": {"kv_bytes": GIB}}))
    _check(model, "cuda:0", "2GiB", 80 * GIB)
    with pytest.raises(PlacementError, match=r"state of lm 1.00 GiB"):
        _check(model, "cpu", "1GiB", None)
