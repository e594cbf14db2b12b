"""Fixtures: one fake engine (text, audio, images) served by a live uvicorn server per test module; one real
two-rank tiny Orpheus server shared by the session (``orpheus_split``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from walkserve.cli.embedded import ensure_embedded
from walkserve.cli.placement_arg import placement_path
from walkserve.core.config import RuntimeConfig
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

from .helpers import live_server
from .real_server import InThreadServer, in_thread_server

ORPHEUS_SPLIT_STREAMS = 1  # --max-streams of the shared Orpheus server: a second real-time stream is surely over it


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(FakeEngineConfig(audio=True, images=True, token_delay_s=0.0005, timelines=16))


@pytest.fixture(scope="module")
def base_url(engine: FakeEngine) -> Iterator[str]:
    with live_server(engine) as url:
        yield url


@pytest.fixture(scope="session")
def orpheus_split(tmp_path_factory) -> Iterator[InThreadServer]:
    """The embedded tiny Orpheus on ``orpheus-split`` (the LM on rank 0, the SNAC codec on rank 1), 71 tokens
    per speech request by default (10 frames), at most one real-time stream at once and no wait for one
    (a stream over capacity is answered 429 at once)."""
    path, _ = ensure_embedded(tmp_path_factory.mktemp("walkserve-cache"))
    runtime = RuntimeConfig(max_running=4, max_streams=ORPHEUS_SPLIT_STREAMS, stream_ttfa_budget_s=0.0)
    with in_thread_server("orpheus", path, runtime, placement=placement_path("orpheus-split"),
                          default_max_tokens=71) as s:
        yield s
