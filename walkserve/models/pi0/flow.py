"""The action chunk by flow matching, as offline loops over a prefix computed once.

    ctx  = PaliGemma(prefix)            K/V of every layer, kept (read-only from here on)
    pi0: ctx += expert(state token)     one token at position n, sees the prefix and itself; kept
    x    = noise ~ N(0, 1) [H, 32],  t = 1
    10x: v = expert(embed_actions(x, t)) over ctx   H tokens at positions n(+1) .. , bidirectional
                                                    among themselves, attending to all of ctx;
                                                    their K/V are never kept
         x = x + dt * v,  dt = -1/10,  t = 1 + step * dt

The serving path runs the same steps through the KV engine (contexts,
queries); these loops use ``DenseAttention`` and are what it is tested
against. ``PrefixKV.key_valid`` carries the padded layout's mask; compact
prefixes have none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from walkserve.layers.attention import DenseAttention
from walkserve.models.pi0.action_expert import ActionExpert
from walkserve.models.pi0.prefix import PrefixInputs
from walkserve.models.pi0.prefix_lm import PaliGemmaLM

KV = dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (k, v) [n, Hkv, Dh]


@dataclass(frozen=True)
class PrefixKV:
    kv: KV
    next_position: int  # the first suffix position: the number of valid context tokens
    key_valid: torch.Tensor | None = None  # [n] bool for a padded prefix; None: all valid

    @property
    def length(self) -> int:
        return self.kv[0][0].shape[0]

    def key_mask(self, queries: int) -> torch.Tensor | None:
        """bool [queries, n + queries] for queries that see the valid context and each other; None if all valid."""
        if self.key_valid is None:
            return None
        own = torch.ones(queries, queries, dtype=torch.bool, device=self.key_valid.device)
        return torch.cat([self.key_valid[None, :].expand(queries, -1), own], dim=1)


def flow_times(num_steps: int) -> list[float]:
    """t of each Euler step: 1, 1 - 1/k, ..., 1/k (computed as 1 + step * dt in double, like lerobot)."""
    dt = -1.0 / num_steps
    return [1.0 + step * dt for step in range(num_steps)]


def euler_step(x: torch.Tensor, v: torch.Tensor, num_steps: int) -> torch.Tensor:
    return x + (-1.0 / num_steps) * v


def compute_prefix(lm: PaliGemmaLM, prefix: PrefixInputs) -> PrefixKV:
    """Run the prefix once (bidirectional over valid tokens) and keep every layer's K/V."""
    valid = None if prefix.all_valid else prefix.valid
    mask = None if valid is None else valid[:, None] & valid[None, :]
    attn = DenseAttention(mask, keep=True)
    ids = torch.zeros(prefix.embeds.shape[0], dtype=torch.long, device=prefix.embeds.device)
    lm(ids, prefix.positions, attn, inputs_embeds=prefix.embeds)
    return PrefixKV(attn.kv, prefix.num_valid, valid)


def append_state(expert: ActionExpert, ctx: PrefixKV, state: torch.Tensor) -> PrefixKV:
    """pi0: write the state token (normalised, padded state [32]) after the prefix; it never sees the actions."""
    embeds = expert.embed_state(state[None])  # [1, W]
    positions = torch.tensor([ctx.next_position], device=embeds.device)
    attn = DenseAttention(ctx.key_mask(1), past=ctx.kv, keep=True)
    expert(torch.zeros(1, dtype=torch.long, device=embeds.device), positions, attn, inputs_embeds=embeds)
    key_valid = None if ctx.key_valid is None else torch.cat([ctx.key_valid, ctx.key_valid.new_ones(1)])
    return PrefixKV(attn.kv, ctx.next_position + 1, key_valid)


def velocity(expert: ActionExpert, ctx: PrefixKV, x: torch.Tensor, t: float) -> torch.Tensor:
    """v [H, 32] of the noisy chunk x [H, 32] at flow time t: one expert call that writes nothing."""
    h = x.shape[0]
    time = torch.full((h,), t, dtype=torch.float32, device=x.device)  # [H]
    embeds = expert.embed_actions(x, time)  # [H, W]
    positions = ctx.next_position + torch.arange(h, device=x.device)  # [H]
    attn = DenseAttention(ctx.key_mask(h), past=ctx.kv)
    hidden = expert(torch.zeros(h, dtype=torch.long, device=x.device), positions, attn, embeds, time=time)
    return expert.compute_velocity(hidden)  # [H, 32]


def sample_actions(expert: ActionExpert, ctx: PrefixKV, noise: torch.Tensor, num_steps: int,
                   trace: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Integrate from noise [H, 32] at t = 1 to the action chunk at t = 0; ``trace`` collects each step's v."""
    x = noise.float()
    for t in flow_times(num_steps):
        v = velocity(expert, ctx, x, t)
        if trace is not None:
            trace.append(v)
        x = euler_step(x, v, num_steps)
    return x  # [H, 32]
