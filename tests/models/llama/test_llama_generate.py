"""Greedy decoding without a cache reproduces transformers generate(do_sample=False)."""

from __future__ import annotations

import pytest
import torch

from walkserve.layers.attention import DenseCausalAttention
from walkserve.models.llama.weights import load_causal_lm

NEW_TOKENS = 20


@torch.no_grad()
def greedy(model, prompt: list[int], max_new: int, eos: set[int]) -> list[int]:
    """Re-run the whole growing sequence each step (no KV cache) and take the argmax of the last logits."""
    ids = list(prompt)
    out: list[int] = []
    for _ in range(max_new):
        x = torch.tensor(ids)
        hidden = model(x, torch.arange(len(ids)), DenseCausalAttention())  # [T, D]
        token = int(model.compute_logits(hidden[-1:]).argmax(-1))
        out.append(token)
        if token in eos:
            break
        ids.append(token)
    return out


@pytest.mark.parity
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_decode_matches_generate(arch, tiny_dirs, oracle):
    path = tiny_dirs[arch]
    ours = load_causal_lm(path, progress=False)
    ref = oracle.hf_model(path)
    prompt = [int(t) for t in torch.randint(0, 500, (7,), generator=torch.Generator().manual_seed(11))]
    with torch.no_grad():
        full = ref.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS)
    want = full[0, len(prompt):].tolist()
    eos = set(ours.config.eos_token_ids)
    got = greedy(ours, prompt, NEW_TOKENS, eos)
    assert got == want
    assert len(got) == NEW_TOKENS  # these seeds never hit eos, so all 20 steps are compared
