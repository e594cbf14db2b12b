"""A family from outside walkserve, registered by an entry point, served with no change to the runtime.

``countdown`` is a complete (if tiny) family defined here: a Walk Graph with one
walk, a ``DynamicLoop`` of one stateless node that subtracts one until it
reaches zero, a state machine, and its components. It is registered the way a
plugin package registers one, by a ``walkserve.models`` entry point in an
installed distribution's metadata (written to a temporary directory on the
path), and served through the real runtime processes: the conductor and the
worker find it by that entry point in their own processes. Its request params
(``CountdownParams``, its own tagged struct) reach its component typed, across
those processes, with no change to the protocol either.
docs/adding-a-model.md walks through the same steps for a real family.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from walkserve.core.params import Params
from walkserve.core.request import RequestSpec, Value
from walkserve.core.sampling import SamplingParams
from walkserve.engines.spec import BuildContext, ComponentSpec
from walkserve.graph import (
    Client,
    DynamicLoop,
    FunctionStateMachine,
    GraphEdge,
    GraphNode,
    StopOnValue,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.graph.stop import max_tokens
from walkserve.models import registry
from walkserve.models.base import Model, ModelRef
from walkserve.testing.fixtures.base import FunctionComponent

FAMILY = "countdown"
TARGET = "tests.models.test_new_family:build"  # the module as the runtime processes import it
ROOT = Path(__file__).resolve().parents[2]


class CountdownParams(Params, frozen=True, tag="countdown"):
    step: int = 1  # subtracted per tick


def tick(firing) -> dict:
    return {"n": (firing.inputs["n"] - firing.params.step).clamp(min=0)}


def first_walk(request: RequestSpec) -> WalkStart:
    return WalkStart("countdown", {"start": request.inputs["start"]})


def no_next_walk(request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
    return None


class Countdown(Model):
    """``start`` in; ``start - step``, ``start - 2 step``, ... out as text events (0 stops the loop and is not sent)."""

    params_type = CountdownParams

    def __init__(self, ref: ModelRef):
        self.ref = ref

    def graph(self) -> WalkGraph:
        loop = DynamicLoop(GraphNode("tick", inputs=["n"], outputs=["n"]), stop=StopOnValue("tick.n", values=(0,)),
                           max_iterations=max_tokens, carry={"tick.n": "tick.n"}, name="count")
        walk = Walk("countdown", loop, edges=[GraphEdge("input.start", "tick.n"), GraphEdge("tick.n", Client("text"))],
                    inputs=["start"])
        return WalkGraph(FAMILY, [walk], FunctionStateMachine(first_walk, no_next_walk))

    def components(self) -> dict[str, ComponentSpec]:
        return {"tick": ComponentSpec("tick", "stateless", build_tick)}


def build_tick(ctx: BuildContext) -> FunctionComponent:
    return FunctionComponent(tick)


def build(ref: ModelRef) -> Countdown:
    """The entry point's factory."""
    return Countdown(ref)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """``countdown`` installed as a plugin: an entry point in a distribution's metadata on the path of this
    process and of the runtime processes it starts."""
    dist = tmp_path / "walkserve_countdown-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: walkserve-countdown\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{registry.ENTRY_POINTS}]\n{FAMILY} = {TARGET}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT))
    paths = [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    # this process may have read the entry points already: read them again, and forget them afterwards
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    monkeypatch.setattr(registry, "_plugins_read", False)


def _texts(result) -> list[int]:
    events = sorted(result.modality("text"), key=lambda e: tuple(e.iteration))
    return [int(np.frombuffer(e.data.data, e.data.dtype)[0]) for e in events]


def test_the_family_is_unknown_until_installed():
    assert FAMILY not in registry.families()


@pytest.mark.slow
@pytest.mark.usefixtures("installed")
def test_an_entry_point_family_is_served_end_to_end():
    from walkserve.core.array import ArrayData
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.sync import Engine
    from walkserve.testing.reference import ReferenceExecutor

    assert FAMILY in registry.families()
    model = registry.load_model(ModelRef(FAMILY))
    assert type(model).__name__ == "Countdown" and model.graph().name == FAMILY
    starts, steps = [1, 2, 5, 9], [1, 1, 1, 2]
    requests = [RequestSpec({"start": ArrayData.from_list([s])}, sampling=SamplingParams(max_tokens=16),
                            params=CountdownParams(step=k)) for s, k in zip(starts, steps, strict=True)]
    placement = {"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["tick"], "ranks": [0]}]}
    with Engine.start(FAMILY, placement=placement, config=RuntimeConfig()) as engine:
        results = engine.run(requests)
    reference = ReferenceExecutor.for_model(model)
    for start, step, request, result in zip(starts, steps, requests, results, strict=True):
        assert result.rejected is None
        assert _texts(result) == list(range(start - step, 0, -step))  # 9 by 2: 7, 5, 3, 1
        oracle = sorted(reference.run(request).outputs, key=lambda o: o.path)
        assert _texts(result) == [int(o.value.numpy().reshape(-1)[0]) for o in oracle]


def test_a_thread_that_asks_while_another_reads_the_entry_points_sees_the_plugins(monkeypatch):
    """Two threads load models at once (the Ray test starts several engines from a pool): the second must not
    take the entry points as read while the first is still reading them."""
    import threading
    import time
    from importlib.metadata import EntryPoint

    plugin = EntryPoint(FAMILY, TARGET, registry.ENTRY_POINTS)
    reading = threading.Event()

    def slow_entry_points(group: str) -> list[EntryPoint]:
        reading.set()
        time.sleep(0.3)
        return [plugin]

    monkeypatch.setattr(registry, "entry_points", slow_entry_points)
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    monkeypatch.setattr(registry, "_plugins_read", False)
    first = threading.Thread(target=registry.families)
    first.start()
    assert reading.wait(5)
    assert FAMILY in registry.families()  # asked while the first thread reads
    first.join(5)
