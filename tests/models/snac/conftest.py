"""Shared fixtures: random-weight SNAC checkpoints and the snac package (the test oracle) loaded on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from walkserve.models.snac.tiny import write_snac


class SnacOracle:
    """The ``snac`` package, driven the way the tests compare against it."""

    def __init__(self):
        import snac

        self.snac = snac

    def load(self, path: Path):
        """``snac.SNAC`` from ``path/config.json`` with ``path/model.safetensors`` loaded strictly."""
        model = self.snac.SNAC(**json.loads((path / "config.json").read_text()))
        model.load_state_dict(load_file(str(path / "model.safetensors")), strict=True)
        return model.eval()

    @staticmethod
    def decode(model, codes: list[torch.Tensor], seed: int) -> torch.Tensor:
        """Its decode with the global RNG seeded right before (its noise comes from there)."""
        torch.manual_seed(seed)
        with torch.inference_mode():
            return model.decode(codes)

    @staticmethod
    def codes(n0: int, batch: int = 1, seed: int = 0) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return [torch.randint(0, 4096, (batch, n0 * m), generator=g) for m in (1, 2, 4)]


@pytest.fixture(scope="session")
def oracle() -> SnacOracle:
    return SnacOracle()


@pytest.fixture(scope="session")
def tiny_snac_dir(tmp_path_factory) -> Path:
    return write_snac(tmp_path_factory.mktemp("snac_tiny"), "tiny", seed=1)
