"""The Gemma decoder stack both pi0 transformers are made of (PaliGemma's gemma_2b, the gemma_300m expert).

    x -> L x ( (h, g) = norm1(x);  x = x + g * attn(h)
               (h, g) = norm2(x);  x = x + g * geglu(h) )  -> (y, _) = norm(x)

``g`` is 1 for the plain (1 + w) RMSNorm and adaRMS's gate in pi0.5's
expert; attention is GQA with rope (theta 1e4) over the caller's positions,
scale head_dim^-0.5, no biases; the MLP is GeGLU with tanh-approximated GELU.
Module names follow the checkpoint (``layers.N.self_attn.q_proj`` ...) except
the fused ``qkv_proj`` and ``mlp.gate_up_proj`` (read through ``checkpoint_parts``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.attention import AttentionContext
from walkserve.layers.linear import FusedLinear, Linear
from walkserve.layers.rope import RotaryEmbedding, apply_rotary
from walkserve.layers.rope_config import RopeConfig
from walkserve.models.pi0.config import GemmaSize
from walkserve.models.pi0.norms import Condition

NormFactory = Callable[[int], nn.Module]  # dim -> a norm returning (y, gate or None)


class GemmaAttention(nn.Module):
    def __init__(self, size: GemmaSize, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = size.num_attention_heads, size.num_key_value_heads, size.head_dim
        self.scale = size.head_dim**-0.5
        self.qkv_proj = FusedLinear(
            size.hidden_size, [("q_proj", size.q_size), ("k_proj", size.kv_size), ("v_proj", size.kv_size)]
        )
        self.o_proj = Linear(size.q_size, size.hidden_size, bias=False)

    def attend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        """The heads' outputs [T, Hq, Dh] before o_proj (the context records this layer's k, v as it attends)."""
        t = x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = apply_rotary(q.view(t, self.num_heads, self.head_dim), cos, sin)  # [T, Hq, Dh]
        k = apply_rotary(k.view(t, self.num_kv_heads, self.head_dim), cos, sin)  # [T, Hkv, Dh]
        v = v.view(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, Dh]
        return attn.forward(self.layer_idx, q, k, v, self.scale)  # [T, Hq, Dh]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        return self.o_proj(self.attend(x, cos, sin, attn).flatten(1))  # [T, D]


class GeGLU(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)); checkpoint names gate_proj, up_proj, down_proj."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = FusedLinear(hidden_size, [("gate_proj", intermediate_size), ("up_proj", intermediate_size)])
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))  # [T, I] each
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)  # [T, D]


def _gated(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return x + y if gate is None else x + y * gate


class GemmaLayer(nn.Module):
    def __init__(self, size: GemmaSize, layer_idx: int, norm: NormFactory):
        super().__init__()
        self.input_layernorm = norm(size.hidden_size)
        self.self_attn = GemmaAttention(size, layer_idx)
        self.post_attention_layernorm = norm(size.hidden_size)
        self.mlp = GeGLU(size.hidden_size, size.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext,
                cond: Condition | None) -> torch.Tensor:
        h, gate = self.input_layernorm(x, cond)
        x = _gated(x, self.self_attn(h, cos, sin, attn), gate)  # [T, D]
        h, gate = self.post_attention_layernorm(x, cond)
        return _gated(x, self.mlp(h), gate)  # [T, D]

    def write_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext,
                 cond: Condition | None) -> None:
        """Only what gives this layer's K/V to ``attn`` (its norm, projections and attention call); no o_proj, no MLP."""
        self.self_attn.attend(self.input_layernorm(x, cond)[0], cos, sin, attn)


class GemmaStack(nn.Module):
    """Decoder layers and the final norm (a checkpoint's ``...model.`` prefix, without embeddings);
    the base of both pi0 transformers."""

    def __init__(self, size: GemmaSize, norm: NormFactory, max_positions: int = 4096):
        super().__init__()
        self.config = size
        self.layers = nn.ModuleList(GemmaLayer(size, i, norm) for i in range(size.num_hidden_layers))
        self.norm = norm(size.hidden_size)
        self.rotary = RotaryEmbedding(size.head_dim, RopeConfig(theta=size.rope_theta), max_positions)

    def run_layers(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                   cond: Condition | None = None, kv_only: bool = False) -> torch.Tensor:
        """x [T, D] at ``positions`` [T] -> hidden after the final norm [T, D].

        ``kv_only``: the caller needs only the K/V ``attn`` records, so the last layer stops once it has
        given its K/V (its o_proj, MLP and the final norm are skipped) and the rows returned are that
        layer's input [T, D], not the hidden states.
        """
        cos, sin = self.rotary.cos_sin(positions)  # [T, Dh/2] float32
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        *full, last = self.layers
        for layer in full:
            x = layer(x, cos, sin, attn, cond)  # [T, D]
        if kv_only:
            last.write_kv(x, cos, sin, attn, cond)
            return x  # [T, D]
        return self.norm(last(x, cos, sin, attn, cond), cond)[0]  # [T, D]
