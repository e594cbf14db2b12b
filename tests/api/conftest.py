"""Fixtures: one fake engine (text, audio, images) served by a live uvicorn server per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

from .helpers import live_server


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(FakeEngineConfig(audio=True, images=True, token_delay_s=0.0005, timelines=16))


@pytest.fixture(scope="module")
def base_url(engine: FakeEngine) -> Iterator[str]:
    with live_server(engine) as url:
        yield url
