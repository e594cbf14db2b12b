"""Cross-component queries (pi0-shaped) and multi-axis positions (Qwen3-Omni's interleaved MRoPE) through the engine."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from tests.engines.kv.contexts_ref import Seg, dense, firing, run
from walkserve.core.options import KVOptions
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.graph.kv import ALL, append, kv_params, query
from walkserve.layers.attention import DenseAttention
from walkserve.layers.rope import RotaryEmbedding

TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(scope="module")
def expert(tmp_path_factory):
    """A second tiny model with the VLM's KV geometry (2 layers, 2 KV heads of 16) but its own width."""
    from walkserve.models.llama.tiny import write_tiny
    from walkserve.models.llama.weights import load_causal_lm

    path = write_tiny("llama", tmp_path_factory.mktemp("expert"), hidden_size=48, intermediate_size=96, init_std=0.1,
                      seed=7)
    return load_causal_lm(path, progress=False)


def _openpi_mask(pad: torch.Tensor, ar: torch.Tensor) -> torch.Tensor:
    """openpi's make_attn_mask: a row sees keys whose block (cumsum of ar) is not later, both valid."""
    blocks = torch.cumsum(ar, 0)
    return (blocks[None, :] <= blocks[:, None]) & (pad[None, :] & pad[:, None])


def test_pi0_action_expert_queries_the_vlm_prefix_like_dense_joint_attention(tiny_lm, expert):
    """The expert's layer l reads the VLM's layer-l prefix K/V; the prefix has padding (masked cameras)."""
    gen = torch.Generator().manual_seed(3)
    d_vlm, d_exp, suffix = tiny_lm.config.hidden_size, expert.config.hidden_size, 5
    valid = torch.tensor([1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0], dtype=torch.bool)  # image | masked image | text | pad
    ids = torch.randint(3, 500, (valid.numel(),), generator=gen)
    image = torch.randn(3, d_vlm, generator=gen)
    positions = torch.cumsum(valid.long(), 0) - 1  # masked cameras and padding take no positions
    engine = KVCacheEngine("vlm", tiny_lm, "cpu", torch.float32,
                           KVOptions(block_size=4, num_blocks=32, seed=0), shared={"expert": expert})
    keep = valid.nonzero().reshape(-1)
    prefix = firing("p", kv_params(append("prefix", mask="full")),
                    {"tokens": ids[keep], "embeds": image, "embed_rows": torch.arange(3), "positions": positions[keep]},
                    outputs=(), component="vlm")
    run(engine, [prefix])
    used = engine.block_manager.num_used
    # the reference: the VLM over the padded prefix (openpi's mask), keeping each layer's K/V
    pad = torch.cat([valid, torch.ones(suffix, dtype=torch.bool)])
    ar = torch.cat([torch.zeros(valid.numel(), dtype=torch.long), torch.tensor([1] + [0] * (suffix - 1))])
    mask = _openpi_mask(pad, ar)
    n = valid.numel()
    x = tiny_lm.embed(ids)
    x[:3] = image
    vlm_attn = DenseAttention(mask[:n, :n], keep=True)
    with torch.no_grad():
        tiny_lm(ids, positions, vlm_attn, inputs_embeds=x)
    actions = torch.randn(suffix, d_exp, generator=gen)
    for _ in range(3):  # flow steps: the suffix changes, the prefix is read-only
        step = firing("p", kv_params(query("prefix", mask="full", rows=ALL)), {"embeds": actions}, component="expert")
        out = run(engine, [step])[step.id]["hidden"]
        suffix_pos = int(valid.sum()) + torch.arange(suffix)  # the running position: valid prefix count + i
        with torch.no_grad():
            want = expert(torch.zeros(suffix, dtype=torch.long), suffix_pos,
                          DenseAttention(mask[n:], past=vlm_attn.kv), inputs_embeds=actions)
        torch.testing.assert_close(out, want, **TOL)
        assert engine.block_manager.num_used == used
        actions = actions - 0.1 * out
    engine.release("p")
    assert engine.block_manager.num_used == 0


def test_a_context_written_by_two_components_runs_each_segment_on_its_writer(tiny_lm, expert):
    """pi0's state token: the VLM writes the prefix, the expert appends one row to the same context; that row is
    computed by the expert (also when the context is recomputed after preemption), and a later query sees both."""
    gen = torch.Generator().manual_seed(5)
    d_exp, n = expert.config.hidden_size, 6
    ids = torch.randint(3, 500, (n,), generator=gen)
    state = torch.randn(1, d_exp, generator=gen)
    actions = torch.randn(3, d_exp, generator=gen)
    engine = KVCacheEngine("vlm", tiny_lm, "cpu", torch.float32,
                           KVOptions(block_size=4, num_blocks=32, seed=0), shared={"expert": expert})
    prefix = firing("p", kv_params(append("prefix", mask="full")), {"tokens": ids}, outputs=(), component="vlm")
    token = firing("p", kv_params(append("prefix")), {"embeds": state}, outputs=("hidden",), component="expert")
    got_state = run(engine, [prefix, token])[token.id]["hidden"]
    vlm_attn = DenseAttention(None, keep=True)
    with torch.no_grad():
        tiny_lm(ids, torch.arange(n), vlm_attn)
        exp_attn = DenseAttention(None, past=vlm_attn.kv, keep=True)
        want_state = expert(torch.zeros(1, dtype=torch.long), torch.tensor([n]), exp_attn, inputs_embeds=state)
    torch.testing.assert_close(got_state, want_state, **TOL)
    engine.scheduler._preempt(engine.scheduler.contexts[("p", "prefix")], engine.scheduler.schedule())
    step = firing("p", kv_params(query("prefix", mask="full", rows=ALL)), {"embeds": actions}, component="expert")
    got = run(engine, [step])[step.id]["hidden"]
    with torch.no_grad():
        want = expert(torch.zeros(3, dtype=torch.long), n + 1 + torch.arange(3), DenseAttention(None, past=exp_attn.kv),
                      inputs_embeds=actions)
    torch.testing.assert_close(got, want, **TOL)
    engine.release("p")


def test_components_of_different_kv_geometry_cannot_share_a_pool(tiny_lm, tmp_path):
    from walkserve.models.llama.tiny import write_tiny
    from walkserve.models.llama.weights import load_causal_lm

    other = load_causal_lm(write_tiny("llama", tmp_path / "o", num_key_value_heads=1), progress=False)
    with pytest.raises(ValueError, match="'lm' and 'other' cannot share a KV pool"):
        KVCacheEngine("lm", tiny_lm, "cpu", torch.float32, KVOptions(num_blocks=4), shared={"other": other})


@pytest.fixture(scope="module")
def mrope_lm(tiny_lm):
    """The tiny LM with Qwen3-Omni's interleaved MRoPE (sections [4, 2, 2] of its 8 frequencies)."""
    model = copy.deepcopy(tiny_lm)
    base = model.model.rotary
    model.model.rotary = RotaryEmbedding(base.head_dim, replace(base.rope, mrope_section=(4, 2, 2), mrope_interleaved=True))
    return model


def test_interleaved_mrope_matches_transformers(mrope_lm):
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeTextConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeThinkerTextRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    config = Qwen3OmniMoeTextConfig(head_dim=16, hidden_size=64, num_attention_heads=4,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "mrope_section": [4, 2, 2], "mrope_interleaved": True})
    hf = Qwen3OmniMoeThinkerTextRotaryEmbedding(config)
    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 50, (3, 9), generator=gen)
    q, k = torch.randn(9, 4, 16, generator=gen), torch.randn(9, 2, 16, generator=gen)
    cos, sin = hf(q, positions[:, None, :])  # [1, T, Dh]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    got_q, got_k = mrope_lm.model.rotary(positions, q, k)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), **TOL)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), **TOL)


def test_float_multi_axis_positions_pass_through(mrope_lm):
    """Fractional video times give float positions; they reach the model as they are."""
    engine = KVCacheEngine("lm", mrope_lm, "cpu", torch.float32, KVOptions(block_size=4, num_blocks=16))
    ids = torch.randint(3, 500, (4,), generator=torch.Generator().manual_seed(8))
    positions = torch.tensor([[0.0, 1.0, 1.5, 2.5], [0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    f = firing("v", kv_params(append("main", rows=ALL)), {"tokens": ids, "positions": positions})
    got = run(engine, [f])[f.id]["hidden"]
    want, _ = dense(mrope_lm, [[Seg(ids, positions)]])
    torch.testing.assert_close(got, want, **TOL)
    token = torch.tensor([9])
    f = firing("v", kv_params(append("main")), {"tokens": token})
    got = run(engine, [f])[f.id]["hidden"]
    want, _ = dense(mrope_lm, [[Seg(ids, positions), Seg(token, torch.full((3, 1), 3.5))]])
    torch.testing.assert_close(got, want[-1:], **TOL)


def test_multi_axis_positions_through_chunks_and_running_decode(mrope_lm):
    """A [3, T] prompt in chunks, then decodes whose running positions are max + 1 on every axis."""
    gen = torch.Generator().manual_seed(4)
    engine = KVCacheEngine("lm", mrope_lm, "cpu", torch.float32,
                           KVOptions(block_size=4, num_blocks=32, max_batch_tokens=5))
    ids = torch.randint(3, 500, (11,), generator=gen)
    positions = torch.stack([torch.arange(11), torch.arange(11) % 4, torch.arange(11) // 4])  # [3, 11]
    positions[:, 3:7] = torch.tensor([[3, 3, 3, 3], [0, 0, 1, 1], [0, 1, 0, 1]])  # a 2 x 2 "image"
    prompt = firing("m", kv_params(append("main", rows=ALL)), {"tokens": ids, "positions": positions})
    got = run(engine, [prompt])[prompt.id]["hidden"]
    want, _ = dense(mrope_lm, [[Seg(ids, positions)]])
    torch.testing.assert_close(got, want, **TOL)
    segs = [Seg(ids, positions)]
    for _ in range(3):
        token = torch.randint(3, 500, (1,), generator=gen)
        f = firing("m", kv_params(append("main")), {"tokens": token})
        got = run(engine, [f])[f.id]["hidden"]
        nxt = int(torch.cat([s.positions for s in segs], dim=1).max()) + 1
        segs.append(Seg(token, torch.full((3, 1), nxt)))
        want, _ = dense(mrope_lm, [segs])
        torch.testing.assert_close(got, want[-1:], **TOL)
