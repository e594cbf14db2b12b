"""BAGEL's Mixture-of-Transformers LLM: Qwen2.5 with q/k norm, two experts, one attention, one KV cache.

Every decoder layer holds two copies of its weights: the understanding expert
(Qwen2's names) and the generation expert (the same names + ``_moe_gen``).
Each token uses one copy, chosen by its kind (``expert``, see ``route.py``);
attention runs once over all tokens, so both experts' keys and values live in
one cache and every token can attend to every other.

    x [T, D] -> L x ( h = x + o_e(attn(rope(qnorm_e(q_e(ln1_e(x)))), ...));  h + mlp_e(ln2_e(h)) )
             -> norm_e -> hidden [T, D]          (e = the expert of each row)
    hidden [N, D] -> lm_head -> logits [N, V] float32     (embed_tokens and lm_head are shared)

Checkpoint names are those of ``ema.safetensors`` under ``language_model.``;
q/k/v and gate/up are read into fused projections (``checkpoint_parts``).
"""

from __future__ import annotations

import torch
from torch import nn

from walkserve.layers.attention import AttentionContext
from walkserve.layers.cpu_linear import linear
from walkserve.layers.linear import FusedLinear, Linear
from walkserve.layers.mlp import SwiGLU
from walkserve.layers.norm import RMSNorm
from walkserve.layers.rope import RotaryEmbedding, apply_rotary
from walkserve.models.bagel.route import ExpertRoute
from walkserve.models.common.lm_config import LMConfig

GEN = "_moe_gen"  # the generation expert's name suffix


def _qkv(c: LMConfig, suffix: str) -> FusedLinear:
    parts = [(f"q_proj{suffix}", c.q_size), (f"k_proj{suffix}", c.kv_size), (f"v_proj{suffix}", c.kv_size)]
    return FusedLinear(c.hidden_size, parts, bias=True)


class MoTAttention(nn.Module):
    """Per-expert q/k/v (with bias), q/k RMSNorm and o_proj (no bias); attention shared by all tokens."""

    def __init__(self, config: LMConfig, layer_idx: int):
        super().__init__()
        c = config
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.scale = c.head_dim**-0.5
        self.qkv_proj, self.qkv_proj_moe_gen = _qkv(c, ""), _qkv(c, GEN)
        self.o_proj = Linear(c.q_size, c.hidden_size, bias=False)
        self.o_proj_moe_gen = Linear(c.q_size, c.hidden_size, bias=False)
        self.q_norm, self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps), RMSNorm(c.head_dim, c.rms_norm_eps)
        self.q_norm_moe_gen = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm_moe_gen = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext,
                route: ExpertRoute) -> torch.Tensor:
        t = x.shape[0]
        qkv = route.map(x, self.qkv_proj, self.qkv_proj_moe_gen)  # [T, (Hq + 2 Hkv) Dh]
        q, k, v = self.qkv_proj.split(qkv)
        q = q.reshape(t, self.num_heads, self.head_dim)  # [T, Hq, Dh]
        k = k.reshape(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, Dh]
        v = v.reshape(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, Dh]
        q = route.map(q, self.q_norm, self.q_norm_moe_gen)
        k = route.map(k, self.k_norm, self.k_norm_moe_gen)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = attn.forward(self.layer_idx, q, k, v, self.scale).reshape(t, -1)  # [T, Hq Dh]
        return route.map(out, self.o_proj, self.o_proj_moe_gen)  # [T, D]


class MoTDecoderLayer(nn.Module):
    """Pre-norm block with per-expert norms and MLPs: x + attn(ln1_e(x)), then h + mlp_e(ln2_e(h))."""

    def __init__(self, config: LMConfig, layer_idx: int):
        super().__init__()
        c = config
        self.self_attn = MoTAttention(c, layer_idx)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)
        self.mlp_moe_gen = SwiGLU(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm_moe_gen = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm_moe_gen = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext,
                route: ExpertRoute) -> torch.Tensor:
        normed = route.map(x, self.input_layernorm, self.input_layernorm_moe_gen)  # [T, D]
        h = x + self.self_attn(normed, cos, sin, attn, route)  # [T, D]
        ffn = route.map(
            h,
            lambda rows: self.mlp(self.post_attention_layernorm(rows)),
            lambda rows: self.mlp_moe_gen(self.post_attention_layernorm_moe_gen(rows)),
        )
        return h + ffn  # [T, D]


class MoTBackbone(nn.Module):
    """Shared embedding, MoT layers and the per-expert final norms (the ``language_model.model.`` prefix)."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MoTDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm_moe_gen = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope, config.max_position_embeddings)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                route: ExpertRoute) -> torch.Tensor:
        cos, sin = self.rotary.cos_sin(positions)  # [T, Dh/2] float32, shared by all layers
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attn, route)  # [T, D]
        return route.map(x, self.norm, self.norm_moe_gen)  # [T, D]


class MoTLM(nn.Module):
    """The KV-cache component: ``forward`` over a ragged batch with the expert of every token.

    ``expert`` [T] (a per-token input; 0 understanding, 1 generation, see
    ``route.py``) defaults to all-understanding: text prefill and decode.
    """

    def __init__(self, config: LMConfig):
        super().__init__()
        if not config.qk_norm or config.tie_word_embeddings or not config.qkv_bias or config.o_bias:
            raise ValueError("BAGEL's LLM has q/k/v bias, no o bias, q/k norm and an untied lm_head")
        self.config = config
        self.model = MoTBackbone(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings: ids [T] -> [T, D]."""
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                inputs_embeds: torch.Tensor | None = None, expert: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states after the final (per-expert) norm, [T, D].

        ``input_ids`` [T] and ``positions`` [T] cover every token of the batch;
        ``inputs_embeds`` [T, D], when given, replaces the lookup (ViT tokens,
        latent tokens and markers spliced in by the caller).
        """
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # [T, D]
        return self.model(x, positions, attn, ExpertRoute(expert, x.shape[0]))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] -> logits [N, V] float32."""
        return linear(hidden, self.lm_head.weight).float()
