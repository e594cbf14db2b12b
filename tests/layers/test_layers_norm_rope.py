"""RMSNorm and rotary embeddings against the transformers implementations."""

from __future__ import annotations

import pytest
import torch

from walkserve.core.errors import ConfigError
from walkserve.layers.norm import RMSNorm
from walkserve.layers.rope import RotaryEmbedding, mrope_axes, rope_inv_freq
from walkserve.layers.rope_config import RopeConfig

GEN = torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_transformers(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ours, ref = RMSNorm(48, eps=1e-5), LlamaRMSNorm(48, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(48, generator=GEN))
        ref.weight.copy_(ours.weight)
    ours, ref = ours.to(dtype), ref.to(dtype)
    x = (3 * torch.randn(5, 7, 48, generator=GEN)).to(dtype)
    assert torch.equal(ours(x), ref(x))
    residual = torch.randn(5, 7, 48, generator=GEN).to(dtype)
    normed, summed = ours.add_forward(x, residual)
    assert torch.equal(summed, x + residual) and torch.equal(normed, ref(x + residual))


def _hf_config(rope_parameters: dict, head_dim: int = 32):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                       max_position_embeddings=4096, rope_parameters=dict(rope_parameters))


ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}


@pytest.mark.parametrize("name", sorted(ROPES))
def test_inv_freq_matches_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _hf_config(ROPES[name], head_dim=128)
    if name == "default":
        want, scale = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        want, scale = ROPE_INIT_FUNCTIONS[name](config, "cpu")
    assert scale == 1.0
    got = rope_inv_freq(RopeConfig.from_hf({"rope_parameters": ROPES[name]}), 128)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", sorted(ROPES))
def test_rotation_matches_transformers(name):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    ref = LlamaRotaryEmbedding(_hf_config(ROPES[name]))
    ours = RotaryEmbedding(32, RopeConfig.from_hf({"rope_parameters": ROPES[name]}), max_positions=4096)
    positions = torch.tensor([0, 1, 2, 7, 300, 2999, 5, 4500])  # ragged and beyond the initial table
    q = torch.randn(8, 4, 32, generator=GEN)
    k = torch.randn(8, 2, 32, generator=GEN)
    cos, sin = ref(q, positions[None])  # [1, T, Dh]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    got_q, got_k = ours(positions, q, k)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), rtol=1e-6, atol=1e-6)


def test_table_grows_lazily_and_stops_checking_at_max_positions():
    rope = RotaryEmbedding(16, RopeConfig(), max_positions=2048)
    assert rope._cos is None
    rope.cos_sin(torch.tensor([3]))
    assert rope._cos.shape == (1024, 8)
    cos, _ = rope.cos_sin(torch.tensor([1500]))
    assert rope._cos.shape == (2048, 8)
    want = torch.cos(1500 * rope_inv_freq(RopeConfig(), 16))
    torch.testing.assert_close(cos[0], want)


def test_partial_rotary_leaves_the_tail():
    cfg = RopeConfig(partial_rotary_factor=0.5)
    rope = RotaryEmbedding(16, cfg)
    full = RotaryEmbedding(8, RopeConfig())
    q = torch.randn(5, 2, 16, generator=GEN)
    positions = torch.arange(5) * 3
    got, _ = rope(positions, q, q)
    assert torch.equal(got[..., 8:], q[..., 8:])
    want, _ = full(positions, q[..., :8].contiguous(), q[..., :8].contiguous())
    torch.testing.assert_close(got[..., :8], want)


def test_rotation_preserves_norm_and_relative_position():
    rope = RotaryEmbedding(32, RopeConfig())
    q, k = torch.randn(1, 1, 32, generator=GEN), torch.randn(1, 1, 32, generator=GEN)
    dots = []
    for shift in (0, 17):
        rq, _ = rope(torch.tensor([5 + shift]), q, k)
        _, rk0 = rope(torch.tensor([2 + shift]), k, k)
        dots.append((rq * rk0).sum())
        torch.testing.assert_close(rq.norm(), q.norm())
    torch.testing.assert_close(dots[0], dots[1], rtol=1e-4, atol=1e-5)


def test_multi_axis_positions_need_an_mrope_section():
    rope = RotaryEmbedding(16, RopeConfig())
    with pytest.raises(NotImplementedError, match="multimodal rope"):
        rope.cos_sin(torch.zeros(3, 4, dtype=torch.long))
    cos, sin = RotaryEmbedding(16, RopeConfig(mrope_section=(2, 3, 3))).cos_sin(torch.arange(4))
    assert cos.shape == sin.shape == (4, 8)  # 1-D positions work with an mrope config


def test_interleaved_mrope_axes_and_text_positions():
    """Real layout [24, 20, 20] over 64 frequencies: h = 1, 4, .., 58; w = 2, 5, .., 59; t keeps the rest."""
    axes = mrope_axes(64, (24, 20, 20), interleaved=True)
    assert [j for j, a in enumerate(axes) if a == 1] == list(range(1, 60, 3))
    assert [j for j, a in enumerate(axes) if a == 2] == list(range(2, 60, 3))
    assert axes.count(0) == 24 and axes[60:] == [0, 0, 0, 0]
    assert mrope_axes(8, (2, 3, 3), interleaved=False) == [0, 0, 1, 1, 1, 2, 2, 2]
    rope = RotaryEmbedding(32, RopeConfig(theta=1e6, mrope_section=(6, 5, 5), mrope_interleaved=True))
    same = torch.arange(7)[None].expand(3, -1)  # text: every axis holds the running index
    for got, want in zip(rope.cos_sin(same), rope.cos_sin(torch.arange(7))):
        torch.testing.assert_close(got, want)
    pos = torch.stack([torch.zeros(5), torch.arange(5.0), 10 + torch.arange(5.0)])  # [3, T]
    cos, _ = rope.cos_sin(pos)
    inv = rope_inv_freq(rope.rope, 32)
    torch.testing.assert_close(cos[:, 1], (pos[1] * inv[1]).cos())  # frequency 1 follows height
    torch.testing.assert_close(cos[:, 2], (pos[2] * inv[2]).cos())  # frequency 2 follows width
    torch.testing.assert_close(cos[:, 15], (pos[0] * inv[15]).cos())  # the last follows time


def test_rope_config_parsing():
    legacy = {"rope_theta": 5e5, "max_position_embeddings": 131072,
              "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}
    new = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    assert RopeConfig.from_hf(legacy) == RopeConfig.from_hf(new)
    assert RopeConfig.from_hf(new).to_hf_parameters() == new["rope_parameters"]
    assert RopeConfig.from_hf({}) == RopeConfig()
    assert RopeConfig.from_hf({"rope_theta": 1e6}).theta == 1e6
    mrope = RopeConfig.from_hf({"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})
    assert (mrope.rope_type, mrope.mrope_section) == ("default", (16, 24, 24))
    with pytest.raises(ConfigError, match="dynamic"):
        RopeConfig.from_hf({"rope_scaling": {"type": "dynamic", "factor": 2.0}})
    with pytest.raises(ConfigError, match="high_freq_factor"):
        RopeConfig(rope_type="llama3", factor=8, low_freq_factor=4, high_freq_factor=1,
                   original_max_position_embeddings=8192)
    with pytest.raises(ConfigError, match="per-layer"):
        RopeConfig.from_hf({"rope_parameters": {"full_attention": {"rope_type": "default"}}})
