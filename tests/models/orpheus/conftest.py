"""A tiny random-weight SNAC checkpoint for the Orpheus codec tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from walkserve.models.snac.tiny import write_snac


@pytest.fixture(scope="session")
def tiny_snac_dir(tmp_path_factory) -> Path:
    return write_snac(tmp_path_factory.mktemp("orpheus_snac"), "tiny", seed=2)
