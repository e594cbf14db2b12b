"""The MoT LLM against transformers' Qwen3 (q/k/v bias, no o bias), one oracle model per expert, float32."""

from __future__ import annotations

import pytest
import torch

from walkserve.layers.attention import DenseAttention

pytestmark = pytest.mark.parity
GEN = torch.Generator().manual_seed(5)


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@torch.no_grad()
def test_understanding_expert_logits_match_qwen3(parts, oracle):
    ids = torch.randint(0, parts.config.llm.vocab_size, (40,), generator=GEN)
    want = oracle.qwen3("und")(input_ids=ids[None], position_ids=torch.arange(40)[None]).logits[0]
    hidden = parts.lm(ids, torch.arange(40), DenseAttention("causal"))  # default expert: understanding
    got = parts.lm.compute_logits(hidden)
    assert got.dtype == torch.float32 and _rel(got, want) < 1e-4


@torch.no_grad()
def test_generation_expert_matches_qwen3_with_moe_gen_weights(parts, oracle):
    """A latent-only sequence (embeddings in) through the gen expert: hidden states and logits."""
    embeds = torch.randn(24, parts.config.hidden_size, generator=GEN)
    ref = oracle.qwen3("gen")(inputs_embeds=embeds[None], position_ids=torch.arange(24)[None], output_hidden_states=True)
    hidden = parts.lm(torch.zeros(24, dtype=torch.long), torch.arange(24), DenseAttention("causal"),
                      inputs_embeds=embeds, expert=torch.ones(24, dtype=torch.long))
    assert _rel(hidden, ref.hidden_states[-1][0]) < 1e-4
    assert _rel(parts.lm.compute_logits(hidden), ref.logits[0]) < 1e-4
    und_only = parts.lm(torch.zeros(24, dtype=torch.long), torch.arange(24), DenseAttention("causal"), inputs_embeds=embeds)
    assert _rel(und_only, ref.hidden_states[-1][0]) > 1e-2  # the two experts really differ


def _mixed_sequence(parts, tokens):
    """text (causal) | VAE block [start, 6 latents, end] | ViT block [start, 5, end] | text: embeddings, experts."""
    lm, d = parts.lm, parts.config.hidden_size
    text1 = torch.randint(0, 300, (7,), generator=GEN)
    text2 = torch.randint(0, 300, (4,), generator=GEN)
    marks = lm.embed(torch.tensor([tokens.vision_start, tokens.vision_end]))
    latent, vit = torch.randn(6, d, generator=GEN), torch.randn(5, d, generator=GEN)
    embeds = torch.cat([lm.embed(text1), marks[:1], latent, marks[1:], marks[:1], vit, marks[1:], lm.embed(text2)])
    expert = torch.tensor([0] * 7 + [0] + [1] * 6 + [0] + [0] * 7 + [0] * 4)
    segments = [("text", 7), ("image", 8), ("image", 7), ("text", 4)]
    return embeds, expert, segments


@torch.no_grad()
def test_mixed_step_matches_dense_two_expert_reference(parts, oracle, tokens):
    embeds, expert, segments = _mixed_sequence(parts, tokens)
    allowed, positions = oracle.packing_mask(segments)
    want = oracle.two_expert_hidden(embeds, expert.bool(), positions, allowed)
    got = parts.lm(torch.zeros(len(expert), dtype=torch.long), positions, DenseAttention(allowed),
                   inputs_embeds=embeds, expert=expert)
    assert _rel(got, want) < 1e-4
    # an und-only packed sequence: HF Qwen3 itself with the same 4-D mask and position ids
    und = torch.zeros_like(expert)
    ref = oracle.qwen3("und")(inputs_embeds=embeds[None], position_ids=positions[None],
                              attention_mask=torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None])
    hidden = parts.lm(torch.zeros(len(expert), dtype=torch.long), positions, DenseAttention(allowed),
                      inputs_embeds=embeds, expert=und)
    assert _rel(parts.lm.compute_logits(hidden), ref.logits[0]) < 1e-4


@torch.no_grad()
def test_cached_blocks_equal_the_packed_sequence(parts, oracle, tokens):
    """Appending the segments one by one over a kept cache (causal text, full blocks) gives the packed rows."""
    embeds, expert, segments = _mixed_sequence(parts, tokens)
    allowed, positions = oracle.packing_mask(segments)
    ids = torch.zeros(len(expert), dtype=torch.long)
    full = parts.lm(ids, positions, DenseAttention(allowed), inputs_embeds=embeds, expert=expert)
    past, start, rows = None, 0, []
    for kind, n in segments:
        part = slice(start, start + n)
        attn = DenseAttention("causal" if kind == "text" else None, past=past, keep=True)
        rows.append(parts.lm(ids[part], positions[part], attn, inputs_embeds=embeds[part], expert=expert[part]))
        past, start = attn.kv, start + n
    torch.testing.assert_close(torch.cat(rows), full, rtol=1e-5, atol=1e-5)
