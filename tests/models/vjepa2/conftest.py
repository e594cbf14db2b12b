"""V-JEPA 2 fixtures: tiny random checkpoints and the references loaded on the same weights.

- ``hf_dir``: an HF-layout V-JEPA 2 checkpoint (``write_tiny_vjepa2``), the oracle being transformers' ``VJEPA2Model``.
- ``released``: a released-layout AC pickle written from cc-vjepa2's own modules (random, perturbed), converted
  by our converter; the oracles are the very modules that wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from walkserve.models.vjepa2.ac_predictor import ACPredictor
from walkserve.models.vjepa2.convert import convert_vjepa2_ac
from walkserve.models.vjepa2.encoder import VisionEncoder
from walkserve.models.vjepa2.tiny import AC_PRESETS, write_tiny_vjepa2
from walkserve.models.vjepa2.weights import load_ac_predictor, load_encoder
from walkserve.testing.vjepa2_upstream import write_released_pickle

TINY_AC = AC_PRESETS["tiny"]


@dataclass
class Released:
    """A converted released-layout checkpoint, our modules loaded from it, and the upstream modules that wrote it."""

    pickle: Path
    out: Path
    encoder: VisionEncoder
    predictor: ACPredictor
    upstream_encoder: nn.Module
    upstream_predictor: nn.Module


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory) -> Path:
    return write_tiny_vjepa2(tmp_path_factory.mktemp("vjepa2_hf"), seed=3)


@pytest.fixture(scope="session")
def released(tmp_path_factory) -> Released:
    root = tmp_path_factory.mktemp("vjepa2_ac")
    pickle = root / "vjepa2-ac-tiny.pt"
    up_encoder, up_predictor = write_released_pickle(pickle, TINY_AC, seed=5)
    e, p = TINY_AC.encoder, TINY_AC.predictor
    out, _ = convert_vjepa2_ac(pickle, root / "converted", crop_size=e.crop_size, max_steps=p.max_steps,
                               encoder_heads=e.vit.num_attention_heads, predictor_heads=p.num_attention_heads)
    return Released(pickle, out, load_encoder(out), load_ac_predictor(out), up_encoder, up_predictor)


@pytest.fixture(scope="session")
def ac_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """31 context-shaped frames [31, F, E] (layer-normed), 31 small actions and states for the tiny AC model."""
    from walkserve.models.vjepa2.rollout import normalize_features

    p = TINY_AC.predictor
    g = torch.Generator().manual_seed(11)
    frames = normalize_features(torch.randn(31, p.frame_tokens, p.input_size, generator=g))
    actions = torch.cat([0.05 * torch.randn(31, 6, generator=g), 0.5 * torch.randn(31, 1, generator=g)], dim=-1)
    states = torch.cat([torch.randn(31, 6, generator=g), torch.rand(31, 1, generator=g)], dim=-1)
    return frames, actions, states
