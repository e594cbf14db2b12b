"""Llama / Qwen2 / Qwen3 decoder-only LM over a ragged batch.

Tokens of every sequence in the batch are concatenated: x is [T, D] with no
batch dim and no padding. Where keys/values live and which tokens attend to
which is the AttentionContext's business; the model only computes q, k, v.

    ids [T] -> embed -> L x (x + attn(norm(x)); x + mlp(norm(x))) -> norm -> hidden [T, D]
    hidden [N, D] -> lm_head (or tied embedding) -> logits [N, V] float32

Module names follow the HF checkpoint (``model.layers.N.self_attn...``) except
the fused ``qkv_proj`` and ``mlp.gate_up_proj``, which read their parts
through ``checkpoint_parts`` (see ``walkserve.layers.linear``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from walkserve.layers.attention import AttentionContext
from walkserve.layers.candidates import intersect_ranges, merged_ranges
from walkserve.layers.cpu_linear import linear
from walkserve.layers.linear import FusedLinear, Linear
from walkserve.layers.mlp import SwiGLU
from walkserve.layers.norm import RMSNorm
from walkserve.layers.rope import RotaryEmbedding, apply_rotary
from walkserve.models.common.lm_config import LMConfig


class Attention(nn.Module):
    """Self-attention: fused q/k/v projection, optional per-head q/k RMSNorm (Qwen3), rope, o_proj."""

    def __init__(self, config: LMConfig, layer_idx: int):
        super().__init__()
        c = config
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.scale = c.head_dim**-0.5
        self.qkv_proj = FusedLinear(
            c.hidden_size, [("q_proj", c.q_size), ("k_proj", c.kv_size), ("v_proj", c.kv_size)], bias=c.qkv_bias
        )
        self.o_proj = Linear(c.q_size, c.hidden_size, bias=c.o_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = q.view(t, self.num_heads, self.head_dim)  # [T, Hq, Dh]
        k = k.view(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, Dh]
        v = v.view(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, Dh]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = attn.forward(self.layer_idx, q, k, v, self.scale)  # [T, Hq, Dh]
        return self.o_proj(out.reshape(t, -1))  # [T, D]


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, config: LMConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext
    ) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)  # [T, D]
        return h + self.mlp(self.post_attention_layernorm(h))  # [T, D]


class Backbone(nn.Module):
    """Embedding, decoder layers and final norm (the ``model.`` prefix of the checkpoint)."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope, config.max_position_embeddings)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                capture: dict[int, torch.Tensor | None] | None = None) -> torch.Tensor:
        cos, sin = self.rotary.cos_sin(positions)  # [T, Dr/2] float32, shared by all layers
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for i, layer in enumerate(self.layers):
            if capture is not None and i in capture:
                capture[i] = x  # [T, D]: the input of layer i
            x = layer(x, cos, sin, attn)  # [T, D]
        return self.norm(x)  # [T, D]


class CausalLM(nn.Module):
    """A decoder-only LM over ragged batches: the interface the KV engine drives."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, config.vocab_size, bias=False
        )
        self.vocab_ranges: tuple[tuple[int, int], ...] | None = None  # see restrict_vocab

    def restrict_vocab(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Compute logits only for ids in these ``[lo, hi)`` ranges; every other id gets -inf.

        For models whose every sampled token is constrained to a known subset
        (Orpheus: the audio ids and END_OF_SPEECH), so the head skips rows the
        sampler would mask anyway. Raises ValueError for a range outside the vocabulary.
        """
        vocab = self.config.vocab_size
        for lo, hi in ranges:
            if not 0 <= lo < hi <= vocab:
                raise ValueError(f"vocabulary range [{lo}, {hi}) is not inside [0, {vocab})")
        self.vocab_ranges = tuple((int(lo), int(hi)) for lo, hi in ranges)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings: ids [T] -> [T, D]."""
        return self.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionContext,
        inputs_embeds: torch.Tensor | None = None,
        capture: dict[int, torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [T, D].

        ``input_ids`` [T] and ``positions`` [T] cover every token of the batch
        (ragged); ``inputs_embeds`` [T, D], when given, replaces the embedding
        lookup (multimodal prompts splice encoder outputs in). ``capture``:
        for every layer index already a key, the input of that layer [T, D]
        is stored under it.
        """
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # [T, D]
        return self.model(x, positions, attn, capture)

    def compute_logits(
        self, hidden: torch.Tensor, allowed: Sequence[Sequence[tuple[int, int]] | None] | None = None
    ) -> torch.Tensor:
        """Logits in float32: hidden [N, D] -> [N, V].

        ``allowed[i]``, when given and not None, lists the only ids row ``i``
        may be sampled from (``[lo, hi)`` ranges, constrained decoding): the
        row's other logits are -inf and are not computed, so an Orpheus step
        reads the 4,097 head rows of its stream position, not all of them.
        Rows are grouped by their ranges, one matmul per group and range.
        Ids outside ``restrict_vocab``'s ranges are -inf in every row.
        """
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if allowed is None or all(a is None for a in allowed):
            if self.vocab_ranges is None:
                return linear(hidden, weight).float()  # [N, V]
            allowed = [None] * hidden.shape[0]
        vocab = weight.shape[0]
        every = self.vocab_ranges or ((0, vocab),)
        groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
        for i, row in enumerate(allowed):
            ranges = every if row is None else intersect_ranges(merged_ranges(row, vocab), every)
            groups.setdefault(ranges, []).append(i)
        logits = torch.full((hidden.shape[0], vocab), float("-inf"), device=hidden.device)  # [N, V]
        for ranges, rows in groups.items():
            if len(rows) == hidden.shape[0]:
                for lo, hi in ranges:
                    logits[:, lo:hi] = linear(hidden, weight[lo:hi])  # [N, hi - lo]: contiguous rows, no copy
                continue
            index = torch.tensor(rows, device=hidden.device)  # [G]
            part = hidden[index]  # [G, D]
            for lo, hi in ranges:
                logits[index, lo:hi] = linear(part, weight[lo:hi]).float()  # [G, hi - lo]
        return logits

    def checkpoint_ignored(self) -> tuple[str, ...]:
        """Checkpoint tensors that may be present but are not read (a tied head some exporters still write)."""
        return ("lm_head.weight",) if self.lm_head is None else ()
