"""Shared fixtures for tests that start real runtime processes."""

from __future__ import annotations

import time

import numpy as np
import pytest

import walkserve.models.builtin  # noqa: F401
from tests.polling import wait_for as wait_until  # noqa: F401  (used by the runtime tests)
from walkserve.core.config import RuntimeConfig
from walkserve.entrypoint.sync import Engine
from walkserve.models.base import ModelRef
from walkserve.models.registry import load_model
from walkserve.testing.reference import ReferenceExecutor
from walkserve.transport import shm


@pytest.fixture(autouse=True)
def shm_back_to_baseline():
    """Every runtime test leaves /dev/shm as it found it."""
    before = set(shm.segments())
    yield
    deadline = time.monotonic() + 5
    while True:
        leaked = set(shm.segments()) - before
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not leaked, f"shared-memory segments left behind: {sorted(leaked)[:5]}"


def placement(n_ranks: int, assign: dict, per_walk: dict | None = None) -> dict:
    """``assign``: node -> rank or [ranks]; ``per_walk``: (walk, node) -> rank, overriding."""
    nodes = [{"nodes": [n], "ranks": r if isinstance(r, list) else [r]} for n, r in assign.items()]
    for (walk, node), r in (per_walk or {}).items():
        nodes.append({"nodes": [node], "ranks": [r], "walks": [walk]})
    return {"ranks": [{"id": i, "device": "cpu"} for i in range(n_ranks)], "nodes": nodes}


def start(family: str, place: dict, **config) -> Engine:
    return Engine.start(family, placement=place, config=RuntimeConfig(**config))


def comparable_events(events) -> list:
    return sorted(((e.modality, e.node, tuple(e.iteration)), np.frombuffer(e.data.data, e.data.dtype).tolist()) for e in events)


def comparable_reference(result) -> list:
    return sorted(((o.modality, o.node, o.path), o.value.numpy().reshape(-1).tolist()) for o in result.outputs)


def reference(family: str) -> ReferenceExecutor:
    return ReferenceExecutor.for_model(load_model(ModelRef(family)))


