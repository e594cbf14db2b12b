"""The V-JEPA 2 reference's timm stand-in lives only while the upstream modules import."""

from __future__ import annotations

import importlib.util
import sys

import pytest

pytest.importorskip("vjepa2")

from walkserve.models.vjepa2.tiny import AC_PRESETS
from walkserve.testing.vjepa2_upstream import upstream_ac_predictor, upstream_encoder


def test_the_timm_stub_is_gone_after_the_reference_is_built():
    config = AC_PRESETS["tiny"]
    upstream_encoder(config.encoder)
    upstream_ac_predictor(config.predictor, config.encoder)
    assert "timm" not in sys.modules
    assert importlib.util.find_spec("timm") is None  # raised ValueError while a spec-less stub stayed behind
