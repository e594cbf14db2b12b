"""A tiny random-weight SNAC checkpoint for the Orpheus codec tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from walkserve.models.snac.tiny import write_snac


@pytest.fixture(scope="session")
def tiny_snac_dir(tmp_path_factory) -> Path:
    return write_snac(tmp_path_factory.mktemp("orpheus_snac"), "tiny", seed=2)


@pytest.fixture(scope="session")
def tiny_orpheus_dir(tmp_path_factory) -> Path:
    """The embedded-demo layout (lm/ + snac/) with the tiny presets."""
    from walkserve.models.orpheus.tiny import write_tiny_orpheus

    return write_tiny_orpheus(tmp_path_factory.mktemp("tiny_orpheus"), lm="tiny", snac="tiny", seed=3)
