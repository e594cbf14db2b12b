"""ActionExpert: the flow-matching transformer of pi0 / pi0.5 (gemma_300m), a KV-cache component.

Its layer l attends to the PaliGemma LM's layer l K/V of the request's prefix
(the two stacks share the KV geometry: 1 KV head of 256) and, bidirectionally,
to the action tokens of the same call. One flow step of one request:

    pi0.5  tokens  = action_in_proj(x_t)                               [H, W]
           cond    = silu(time_mlp_out(silu(time_mlp_in(sincos(t)))))  every norm is adaRMS of cond
    pi0    tokens  = action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t) | sincos(t)])))
           (and before the first step, once: the state token state_proj(state), written after the prefix)
    v_t    = action_out_proj(expert(tokens))                           [H, 32]

sincos(t) = [sin | cos](2 pi t / period), period = min_period * (max_period / min_period) ** linspace(0, 1, W/2).

Everything is per token, so requests at different flow times batch in one
call: ``time`` [T] gives each token its request's t.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from walkserve.layers.attention import AttentionContext
from walkserve.layers.linear import Linear
from walkserve.models.pi0.config import GemmaSize, PolicyConfig
from walkserve.models.pi0.gemma import GemmaStack
from walkserve.models.pi0.norms import AdaRMSNorm, Condition, GemmaRMSNorm


class ActionTokens:
    """The action projections and the flow-time features, shared by the expert and the flow head (``flow_head.py``).

    ``add_projections`` creates the checkpoint's root modules (``action_in_proj``,
    ``action_out_proj``; pi0: ``state_proj``, ``action_time_mlp_{in,out}``) on the
    module that mixes this in; pi0.5's ``time_mlp_*`` belong to the expert (adaRMS).
    """

    pi05: bool
    width: int
    min_period: float
    max_period: float

    def add_projections(self, config: PolicyConfig, width: int) -> None:
        self.pi05, self.width = config.pi05, width
        self.min_period, self.max_period = config.min_period, config.max_period
        self.action_in_proj = Linear(config.max_action_dim, width)
        self.action_out_proj = Linear(width, config.max_action_dim)
        if not self.pi05:
            self.state_proj = Linear(config.max_state_dim, width)
            self.action_time_mlp_in = Linear(2 * width, width)
            self.action_time_mlp_out = Linear(width, width)

    def time_features(self, time: torch.Tensor) -> torch.Tensor:
        """sincos(t): time [N] -> [N, W] in the weights' dtype (computed in float64 where the device can)."""
        dtype = torch.float32 if time.device.type == "mps" else torch.float64
        fraction = torch.linspace(0.0, 1.0, self.width // 2, dtype=dtype, device=time.device)  # [W/2]
        period = self.min_period * (self.max_period / self.min_period) ** fraction
        angle = (2 * math.pi / period)[None, :] * time.to(dtype)[:, None]  # [N, W/2]
        return torch.cat([angle.sin(), angle.cos()], dim=-1).float().to(self.action_in_proj.weight.dtype)

    def embed_actions(self, actions: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """Action tokens: noisy actions [T, 32] at per-token flow times [T] -> inputs_embeds [T, W]."""
        x = self.action_in_proj(actions.to(self.action_in_proj.weight.dtype))  # [T, W]
        if self.pi05:
            return x  # time enters through adaRMS, never the tokens
        x = torch.cat([x, self.time_features(time)], dim=-1)  # [T, 2W]
        return self.action_time_mlp_out(F.silu(self.action_time_mlp_in(x)))  # [T, W]

    def embed_state(self, state: torch.Tensor) -> torch.Tensor:
        """pi0's state token: normalised, zero-padded state [N, 32] -> [N, W]."""
        assert not self.pi05, "pi0.5 reads the state as prompt tokens"
        return self.state_proj(state.to(self.state_proj.weight.dtype))

    def compute_velocity(self, hidden: torch.Tensor) -> torch.Tensor:
        """The flow velocity of action tokens, float32: hidden [N, W] -> [N, 32]."""
        return self.action_out_proj(hidden.float().to(self.action_out_proj.weight.dtype)).float()


class ActionExpert(GemmaStack, ActionTokens):
    """Parameter names: ``layers.*`` / ``norm.*`` are the checkpoint's under
    ``paligemma_with_expert.gemma_expert.model.``; the projections are at its root."""

    def __init__(self, config: PolicyConfig, max_positions: int = 4096):
        size: GemmaSize = config.expert
        width, eps = size.hidden_size, size.rms_norm_eps
        norm = (lambda dim: AdaRMSNorm(dim, width, eps)) if config.pi05 else (lambda dim: GemmaRMSNorm(dim, eps))
        super().__init__(size, norm, max_positions)
        self.add_projections(config, width)
        if self.pi05:
            self.time_mlp_in = Linear(width, width)
            self.time_mlp_out = Linear(width, width)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The expert has no vocabulary: zeros [T, W] that the engine overwrites with the firing's embeddings."""
        weight = self.action_in_proj.weight
        return torch.zeros(input_ids.shape[0], self.width, dtype=weight.dtype, device=weight.device)

    def condition(self, time: torch.Tensor) -> Condition:
        """pi0.5's adaRMS condition for per-token times [T], computed once per distinct time."""
        times, index = torch.unique(time, return_inverse=True)  # [U], [T]
        h = F.silu(self.time_mlp_in(self.time_features(times)))
        return Condition(F.silu(self.time_mlp_out(h)), index)  # rows [U, W]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                inputs_embeds: torch.Tensor | None = None, time: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states after the final norm [T, W].

        ``inputs_embeds`` [T, W] (from ``embed_actions`` / ``embed_state``) is
        required: the expert has no vocabulary and ignores ``input_ids``.
        ``time`` [T] (a token input) is required by pi0.5, unused by pi0.
        """
        if inputs_embeds is None:
            raise ValueError("the action expert takes inputs_embeds (embed_actions / embed_state), not token ids")
        cond = None
        if self.pi05:
            if time is None or time.shape[0] != inputs_embeds.shape[0]:
                raise ValueError("pi0.5's expert needs the token input time [T], one flow time per token")
            cond = self.condition(time)
        return self.run_layers(inputs_embeds, positions, attn, cond)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The KV-component seam asks for a head; the expert's is ``compute_velocity`` (its nodes read ``hidden``)."""
        raise ValueError("the action expert has no vocabulary: read its hidden rows (compute_velocity)")
