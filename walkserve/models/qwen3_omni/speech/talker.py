"""The Qwen3-Omni talker: a MoE LM over codec frames that writes code 0 of each frame (a KV-cache component).

    inputs_embeds [T, D] (built by talker_inputs.py) -> L x (x + attn(norm(x)); h + moe(norm(h))) -> norm
        -> hidden [T, D] -> codec_head -> logits [T, 3072] float32

    attn:  q/k RMSNorm per head, interleaved 3-axis rope (positions [3, T]; [T] for text-only rows)
    moe:   softmax router, top-6 of 128 experts renormalised, plus a shared SwiGLU expert
           scaled by sigmoid(shared_expert_gate(x))         (walkserve.layers.moe.SparseMoE)

The talker has no text vocabulary of its own: text reaches it as
``text_projection`` of the thinker's input embedding, media positions as
``hidden_projection`` of the thinker's accept-layer state, and codes as
``codec_embedding`` (``embed``). Checkpoint prefix ``talker.`` (without
``talker.code_predictor.``); module names follow it, except the fused
``qkv_proj`` / ``gate_up_proj`` / stacked experts, which read their parts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.attention import AttentionContext
from walkserve.layers.cpu_linear import linear
from walkserve.layers.linear import Linear
from walkserve.layers.moe import SparseMoE
from walkserve.layers.norm import RMSNorm
from walkserve.layers.rope import RotaryEmbedding
from walkserve.models.common.decoder import Attention
from walkserve.models.qwen3_omni.speech.config import TalkerConfig


class ResizeMLP(nn.Module):
    """Thinker width -> talker width: linear_fc2(silu(linear_fc1(x))), both with bias (text/hidden_projection)."""

    def __init__(self, in_size: int, intermediate_size: int, out_size: int):
        super().__init__()
        self.linear_fc1 = Linear(in_size, intermediate_size, bias=True)
        self.linear_fc2 = Linear(intermediate_size, out_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))  # [T, D_talker]


class TalkerLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then h + moe(norm(h))."""

    def __init__(self, config: TalkerConfig, layer_idx: int):
        super().__init__()
        c = config
        self.self_attn = Attention(c.attention.as_lm_config(c.vocab_size, c.moe_intermediate_size), layer_idx)
        self.mlp = SparseMoE(c.hidden_size, c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok,
                             c.norm_topk_prob, c.shared_expert_intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.attention.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.attention.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)  # [T, D]
        return h + self.mlp(self.post_attention_layernorm(h))  # [T, D]


class TalkerModel(nn.Module):
    """Codec embedding, decoder layers and final norm (the ``talker.model.`` prefix)."""

    def __init__(self, config: TalkerConfig):
        super().__init__()
        a = config.attention
        self.codec_embedding = nn.Embedding(config.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(TalkerLayer(config, i) for i in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.rotary = RotaryEmbedding(a.head_dim, a.rope, a.max_position_embeddings)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        cos, sin = self.rotary.cos_sin(positions)  # [T, Dh/2] float32, from [3, T] (or [T]) positions
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attn)  # [T, D]
        return self.norm(x)  # [T, D]


class Talker(nn.Module):
    """The talker LM with its head and its two input projections: the interface the KV engine drives."""

    def __init__(self, config: TalkerConfig):
        super().__init__()
        c = config
        self.config = config
        self.model = TalkerModel(config)
        self.codec_head = Linear(c.hidden_size, c.vocab_size, bias=False)
        self.text_projection = ResizeMLP(c.thinker_hidden_size, c.projection_intermediate_size, c.hidden_size)
        self.hidden_projection = ResizeMLP(c.thinker_hidden_size, c.projection_intermediate_size, c.hidden_size)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Codec embeddings: ids [T] -> [T, D] (code 0 of a frame and the codec control ids)."""
        return self.model.codec_embedding(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        attn: AttentionContext,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [T, D]. Positions: [3, T] (t, h, w) or [T] (all axes equal).

        Every talker position is a sum of parts (see talker_inputs.py), so
        ``inputs_embeds`` is the normal input; ``input_ids`` is embedded only
        when it is None.
        """
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # [T, D]
        return self.model(x, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Code-0 logits over the whole codec vocabulary, float32: hidden [N, D] -> [N, V].

        Which ids may be drawn is the sampler's business (``speech_rules.code0_ranges``).
        """
        return linear(hidden, self.codec_head.weight).float()

    def project_text(self, thinker_embeds: torch.Tensor) -> torch.Tensor:
        """Thinker input embeddings [T, Dt] -> talker inputs [T, D]."""
        return self.text_projection(thinker_embeds)

    def project_hidden(self, accept_states: torch.Tensor) -> torch.Tensor:
        """Thinker states entering layer ``accept_hidden_layer`` [T, Dt] -> talker inputs [T, D]."""
        return self.hidden_projection(accept_states)
