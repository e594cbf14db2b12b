"""The in-process API's own logic: which placement a run gets, the per-request channel, and what an
abort sends to the conductor."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from walkserve.core.errors import PlacementError
from walkserve.core.finish import FinishReason
from walkserve.entrypoint import engine as frontend
from walkserve.entrypoint.engine import AsyncEngine, _Channel, device_free_bytes, resolve_placement
from walkserve.models.base import ModelRef
from walkserve.models.registry import load_model
from walkserve.placement import parse_placement
from walkserve.protocol import messages as m
from walkserve.protocol.codec import decode
from walkserve.protocol.run import RunSpec

PLACED = {"ranks": [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [1]}]}


@pytest.fixture(scope="module")
def model():
    return load_model(ModelRef("fixture-lm"))


def test_no_placement_puts_every_node_on_rank_0_of_the_default_device(model, monkeypatch):
    data, source = resolve_placement(model, None)
    assert source == "<default placement>" and data["nodes"] == [{"nodes": ["lm"], "ranks": [0]}]
    monkeypatch.setattr(frontend, "default_device", lambda: "cuda:0")
    assert resolve_placement(model, None)[0]["ranks"] == [{"id": 0, "device": "cuda:0"}]


def test_a_placement_is_a_mapping_or_a_yaml_file(model, tmp_path):
    assert resolve_placement(model, PLACED) == (PLACED, "<placement>")
    path = tmp_path / "p.yaml"
    path.write_text("ranks: [{id: 0, device: cpu}]\nnodes: [{nodes: [lm], ranks: [0]}]\n")
    assert resolve_placement(model, path)[1] == str(path)
    with pytest.raises(PlacementError, match="unknown rank 7"):
        resolve_placement(model, {"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [7]}]})
    with pytest.raises(TypeError, match="mapping or a YAML path"):
        resolve_placement(model, parse_placement(PLACED))


def test_no_gpu_here_means_no_free_memory_to_read():
    assert device_free_bytes("cuda:0") is None  # the CPU build of torch sees no CUDA device


async def test_a_channel_hands_items_over_in_order():
    channel = _Channel()
    reader = asyncio.ensure_future(channel.get())
    await asyncio.sleep(0)
    channel.put("a")
    channel.put("b")
    assert await reader == "a" and await channel.get() == "b"


async def test_abort_tells_the_conductor_why(model, tmp_path):
    spec = RunSpec("r0front", "tok", str(tmp_path), "fixture-lm", None, {}, PLACED, "<test>")
    ctx = zmq.Context()
    conductor = ctx.socket(zmq.PULL)
    conductor.setsockopt(zmq.RCVTIMEO, 5000)
    conductor.bind(spec.conductor_address)
    engine = AsyncEngine(model, spec)
    try:
        await engine.abort("r1")
        await engine.abort("r2", FinishReason.STOP)
        frames = [conductor.recv() for _ in range(2)]
        assert [msg for f in frames for msg in decode(f, "tok")] == [m.Abort("r1", "abort"), m.Abort("r2", "stop")]
    finally:
        engine.inbox.close(0)
        engine.outbox.close(0)
        engine.ctx.term()
        conductor.close(0)
        ctx.term()
