"""Logits parity with transformers on tiny random checkpoints written by write_tiny."""

from __future__ import annotations

import json

import pytest
import torch

from walkserve.layers.attention import AttentionContext, DenseCausalAttention
from walkserve.models.llama.tiny import write_tiny
from walkserve.models.llama.weights import load_causal_lm

pytestmark = pytest.mark.parity
torch.set_num_threads(1)

# name -> (arch, overrides). Covers GQA ratios 1/2/4 and one KV head (MQA), tied/untied, rope
# default/llama3/linear, both config spellings, odd vocab (also past the tokenizer's ~830 ids), odd head dims and
# hidden and MLP widths, one layer, a context the 48 tokens fill, biases, sharded checkpoints, config.json
# fields left out ("drop": transformers' defaults apply, e.g. Qwen3's head_dim of 128), hidden_act "swish" and a
# sliding window no layer uses ("json": fields set in config.json as written).
CASES = {
    "llama-gqa2-untied-default": ("llama", {}),
    "llama-gqa4-tied-llama3-legacy": (
        "llama", {"num_attention_heads": 8, "head_dim": 8, "tie_word_embeddings": True, "rope": "llama3",
                  "rope_theta": 500000.0, "rope_form": "legacy"}),
    "llama-gqa1-linear-v997-hd24-bias-sharded": (
        "llama", {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 24, "vocab_size": 997,
                  "rope": "linear", "attention_bias": True, "mlp_bias": True, "shards": 3}),
    "qwen2-gqa2-tied-default": ("qwen2", {"tie_word_embeddings": True, "rope_theta": 1000000.0}),
    "qwen2-gqa4-linear-v997-hd24-legacy-sharded": (
        "qwen2", {"num_attention_heads": 8, "head_dim": 24, "vocab_size": 997, "rope": "linear",
                  "rope_form": "legacy", "shards": 2}),
    "qwen3-gqa2-untied-default": ("qwen3", {"num_hidden_layers": 3}),
    "qwen3-gqa1-tied-llama3-hd24-legacy": (
        "qwen3", {"num_key_value_heads": 4, "head_dim": 24, "tie_word_embeddings": True, "rope": "llama3",
                  "rope_form": "legacy"}),
    "qwen3-gqa4-bias-v997-sharded": (
        "qwen3", {"num_attention_heads": 8, "head_dim": 8, "attention_bias": True, "vocab_size": 997,
                  "shards": 4}),
    "llama-mqa-tied-v1001-L1-i97": (
        "llama", {"num_key_value_heads": 1, "vocab_size": 1001, "tie_word_embeddings": True, "num_hidden_layers": 1,
                  "intermediate_size": 97}),
    "qwen2-mqa-hd32-llama3-v1001-ctx48": (
        "qwen2", {"num_key_value_heads": 1, "head_dim": 32, "rope": "llama3", "vocab_size": 1001,
                  "max_position_embeddings": 48}),
    "qwen3-h3-hd10-d30-i131-L1": (
        "qwen3", {"hidden_size": 30, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 10,
                  "intermediate_size": 131, "num_hidden_layers": 1}),
    "qwen3-no-head-dim-field": ("qwen3", {"head_dim": 128, "num_hidden_layers": 1, "drop": ("head_dim",)}),
    "llama-swish-no-kv-field": ("llama", {"num_key_value_heads": 4, "hidden_act": "swish",
                                          "drop": ("num_key_value_heads",)}),
    # a 4-token window that starts past the last layer: transformers builds every layer full, as we do
    "qwen2-sliding-window-past-the-layers": ("qwen2", {"json": {"use_sliding_window": True, "sliding_window": 4,
                                                                "max_window_layers": 2}}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers(name, tmp_path, oracle):
    arch, overrides = CASES[name]
    edits = {k: overrides[k] for k in ("drop", "hidden_act", "json") if k in overrides}  # config.json edits after writing
    path = write_tiny(arch, tmp_path / name, seed=7, **{k: v for k, v in overrides.items() if k not in edits})
    if edits:
        config = json.loads((path / "config.json").read_text())
        config = {k: v for k, v in config.items() if k not in edits.get("drop", ())}
        config.update({k: v for k, v in edits.items() if k not in ("drop", "json")} | edits.get("json", {}))
        (path / "config.json").write_text(json.dumps(config))
    ours = load_causal_lm(path, progress=False)
    ref = oracle.hf_model(path)
    ids = torch.randint(0, ours.config.vocab_size, (48,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids[None]).logits[0]  # [T, V]
    got = oracle.our_logits(ours, ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert oracle.rel_err(got, want) < 1e-4


class _PerSequenceAttention(AttentionContext):
    """Causal attention within each sequence of a ragged batch (test stand-in for the paged context)."""

    def __init__(self, lengths: list[int]):
        self.lengths = lengths

    def forward(self, layer, q, k, v, scale):
        dense = DenseCausalAttention()
        outs, start = [], 0
        for n in self.lengths:
            part = slice(start, start + n)
            outs.append(dense.forward(layer, q[part], k[part], v[part], scale))
            start += n
        return torch.cat(outs)


@torch.no_grad()
def test_ragged_batch_equals_separate_sequences(tiny_dirs):
    model = load_causal_lm(tiny_dirs["qwen3"], progress=False)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 500, (n,), generator=gen) for n in (5, 11, 1)]
    ids = torch.cat(seqs)
    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    hidden = model(ids, positions, _PerSequenceAttention([len(s) for s in seqs]))
    expected = torch.cat([model(s, torch.arange(len(s)), DenseCausalAttention()) for s in seqs])
    torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_inputs_embeds_replace_the_lookup(tiny_dirs):
    model = load_causal_lm(tiny_dirs["llama"], progress=False)
    ids = torch.tensor([3, 14, 15, 92, 65])
    positions = torch.arange(5)
    from_ids = model(ids, positions, DenseCausalAttention())
    from_embeds = model(ids, positions, DenseCausalAttention(), inputs_embeds=model.embed(ids))
    torch.testing.assert_close(from_ids, from_embeds, rtol=0, atol=0)
    edited = model.embed(ids).clone()
    edited[2] += 1.0
    assert not torch.allclose(model(ids, positions, DenseCausalAttention(), inputs_embeds=edited), from_ids)


@torch.no_grad()
def test_bfloat16_load(tiny_dirs, tmp_path, oracle):
    path = tiny_dirs["llama"]
    fp32 = load_causal_lm(path, progress=False)
    bf16 = load_causal_lm(path, dtype="bfloat16", progress=False)
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    ids = torch.randint(0, 500, (24,), generator=torch.Generator().manual_seed(5))
    got = oracle.our_logits(bf16, ids)
    assert got.dtype == torch.float32
    assert oracle.rel_err(got, oracle.our_logits(fp32, ids)) < 5e-2
    with torch.no_grad():
        want = oracle.hf_model(path, dtype=torch.bfloat16)(ids[None]).logits[0]
    assert oracle.rel_err(got, want) < 3e-2
    # A checkpoint stored in bf16 loads in bf16 by default (config dtype).
    stored = write_tiny("qwen2", tmp_path / "bf16", dtype="bfloat16")
    assert {p.dtype for p in load_causal_lm(stored, progress=False).parameters()} == {torch.bfloat16}
