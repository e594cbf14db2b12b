"""The Qwen3-Omni thinker: a MoE decoder with interleaved MRoPE and deepstack, as a KV-cache component.

    ids [T] -> embed (or inputs_embeds: audio/vision features spliced in)
      -> L x (x + attn(norm(x)); x + moe(norm(x)))       attn: q/k RMSNorm per head, MRoPE over [3, T]
         after layer i < len(deepstack): x += deepstack[:, i]   (zero rows for non-visual tokens)
      -> norm -> hidden [T, D];   hidden [N, D] -> lm_head (untied) -> logits [N, V] float32

Tokens of every sequence of a batch are concatenated (no batch dim, no
padding); where keys and values live is the AttentionContext's business.
Module names follow the checkpoint under ``thinker.``: ``model.layers.N.self_attn.{q,k,v,o}_proj``
(q/k/v read into ``qkv_proj``), ``model.layers.N.mlp.gate`` and ``mlp.experts.E.*``,
``model.norm``, ``lm_head``.
"""

from __future__ import annotations

import torch
from torch import nn

from walkserve.layers.attention import AttentionContext
from walkserve.layers.cpu_linear import linear
from walkserve.layers.linear import Linear
from walkserve.layers.mlp import SwiGLU
from walkserve.layers.moe import SparseMoE
from walkserve.layers.norm import RMSNorm
from walkserve.layers.rope import RotaryEmbedding
from walkserve.models.common.decoder import Attention
from walkserve.models.qwen3_omni.config import ThinkerTextConfig


class _AttentionShape:
    """The fields ``common.decoder.Attention`` reads, for the thinker's config (no biases, q/k norm)."""

    def __init__(self, c: ThinkerTextConfig):
        self.num_attention_heads, self.num_key_value_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim, self.hidden_size, self.rms_norm_eps = c.head_dim, c.hidden_size, c.rms_norm_eps
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.qkv_bias = self.o_bias = c.attention_bias
        self.qk_norm = True


class ThinkerDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then h + mlp(norm(h)); mlp is the sparse MoE (or a dense SwiGLU)."""

    def __init__(self, config: ThinkerTextConfig, layer_idx: int):
        super().__init__()
        c = config
        self.self_attn = Attention(_AttentionShape(c), layer_idx)
        if c.is_moe_layer(layer_idx):
            self.mlp = SparseMoE(c.hidden_size, c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok,
                                 c.norm_topk_prob)
        else:
            self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)  # [T, D]
        return h + self.mlp(self.post_attention_layernorm(h))  # [T, D]


class ThinkerBackbone(nn.Module):
    """Embedding, decoder layers, final norm (``thinker.model.``)."""

    def __init__(self, config: ThinkerTextConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(ThinkerDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope, config.max_position_embeddings)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionContext,
        deepstack: torch.Tensor | None = None,
        capture: dict[int, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        cos, sin = self.rotary.cos_sin(positions)  # [T, Dh/2] float32, shared by all layers
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        levels = 0 if deepstack is None else deepstack.shape[1]
        for i, layer in enumerate(self.layers):
            if capture is not None and i in capture:
                capture[i] = x  # the input of layer i (after the previous layer's deepstack add)
            x = layer(x, cos, sin, attn)  # [T, D]
            if i < levels:
                x = x + deepstack[:, i].to(x.dtype)  # [T, D]: visual rows get their ViT-level feature
        if capture is not None and len(self.layers) in capture:
            capture[len(self.layers)] = x  # the input of the final norm
        return self.norm(x)  # [T, D]


class ThinkerLM(nn.Module):
    """The thinker as the KV engine drives it (the interface of ``common.decoder.CausalLM``).

    Positions are ``[3, T]`` (temporal, height, width; ``rope_index``) or
    ``[T]`` for text-only batches, where the three axes coincide.
    """

    def __init__(self, config: ThinkerTextConfig):
        super().__init__()
        self.config = config
        self.model = ThinkerBackbone(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings: ids [T] -> [T, D]."""
        return self.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionContext,
        inputs_embeds: torch.Tensor | None = None,
        deepstack: torch.Tensor | None = None,
        capture: dict[int, torch.Tensor] | None = None,
        visual_embeds: torch.Tensor | None = None,
        visual_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [T, D].

        ``inputs_embeds`` [T, D] replaces the embedding lookup (audio and visual
        features at their placeholder rows). ``deepstack`` [T, n, D], a per-token
        input, is added to the hidden state after decoder layers 0..n-1: the ViT
        deepstack features at visual rows, zeros elsewhere. ``capture``: for each
        key k already present, ``capture[k]`` is set to the input of layer k
        (k = num_hidden_layers: the input of the final norm). ``visual_embeds`` [T, D]
        with ``visual_rows`` (bool [T]), per-token inputs too, replace the embeddings at
        those rows (a chunk whose ``inputs_embeds`` already hold another item's features).
        """
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # [T, D]
        if visual_embeds is not None:
            if visual_rows is None:
                raise ValueError("visual_embeds needs visual_rows (which rows they replace)")
            x = torch.where(visual_rows.reshape(-1, 1).to(torch.bool), visual_embeds.to(x.dtype), x)  # [T, D]
        if deepstack is not None and deepstack.shape[0] != x.shape[0]:
            raise ValueError(f"deepstack has {deepstack.shape[0]} rows for {x.shape[0]} tokens")
        if capture is not None and any(not 0 <= k <= self.config.num_hidden_layers for k in capture):
            raise ValueError(f"capture layers must be in [0, {self.config.num_hidden_layers}], got {sorted(capture)}")
        return self.model(x, positions, attn, deepstack, capture)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in float32: hidden [N, D] -> [N, V]."""
        return linear(hidden, self.lm_head.weight).float()  # [N, V]
