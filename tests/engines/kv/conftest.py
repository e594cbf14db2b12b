"""Shared fixtures: a tiny random Llama checkpoint, our CausalLM on it, and the transformers oracle."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from walkserve.models.llama.tiny import write_tiny

    return write_tiny("llama", tmp_path_factory.mktemp("tiny_llama"), init_std=0.1)


@pytest.fixture(scope="session")
def tiny_lm(tiny_llama_dir):
    from walkserve.models.llama.weights import load_causal_lm

    torch.set_num_threads(1)
    return load_causal_lm(tiny_llama_dir, progress=False)


@pytest.fixture(scope="session")
def hf_lm(tiny_llama_dir):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens, like the driver
    return model
