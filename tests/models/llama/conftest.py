"""Shared fixtures for the Llama / Qwen2 / Qwen3 tests: tiny checkpoints and the transformers oracle."""

from __future__ import annotations

import os

import pytest
import torch

from walkserve.layers.attention import DenseCausalAttention
from walkserve.models.llama.tiny import write_tiny

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """One default tiny checkpoint per architecture, written once per session."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny(arch, root / arch, seed=1) for arch in ("llama", "qwen2", "qwen3")}


class Oracle:
    """The transformers reference and the comparisons the parity tests share."""

    @staticmethod
    def hf_model(path, dtype=torch.float32):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()

    @staticmethod
    @torch.no_grad()
    def our_logits(model, ids: torch.Tensor) -> torch.Tensor:
        """Full-sequence logits [T, V] of our CausalLM on one sequence."""
        hidden = model(ids, torch.arange(ids.shape[0]), DenseCausalAttention())
        return model.compute_logits(hidden)

    @staticmethod
    def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
        """max |a - b| / max |b|."""
        return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.fixture(scope="session")
def oracle() -> type[Oracle]:
    return Oracle
