"""Sparse mixture of experts: softmax router, top-k experts, optional gated shared expert.

Qwen2-MoE / Qwen3-MoE / Qwen3-Omni layout. Checkpoint names (one tensor per expert):

    mlp.gate.weight                         [E, D]    router
    mlp.experts.{e}.gate_proj.weight        [I, D]
    mlp.experts.{e}.up_proj.weight          [I, D]
    mlp.experts.{e}.down_proj.weight        [D, I]
    mlp.shared_expert.{gate,up,down}_proj.weight      (optional)
    mlp.shared_expert_gate.weight           [1, D]    (optional)

The experts are held stacked (``gate_up [E, 2I, D]``, ``down [E, D, I]``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.linear import CheckpointParts
from walkserve.layers.mlp import SwiGLU


class Experts(nn.Module):
    """E SwiGLU experts with stacked weights; runs each expert once on all tokens routed to it."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.gate_up = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def checkpoint_parts(self, prefix: str) -> CheckpointParts:
        i = self.intermediate_size
        out: CheckpointParts = {}
        for e in range(self.num_experts):
            out[f"{prefix}.{e}.gate_proj.weight"] = ("gate_up", (e, slice(0, i)))
            out[f"{prefix}.{e}.up_proj.weight"] = ("gate_up", (e, slice(i, 2 * i)))
            out[f"{prefix}.{e}.down_proj.weight"] = ("down", (e,))
        return out

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, D], expert_ids / weights [T, K] -> sum_k weights[t, k] * expert_{ids[t, k]}(x[t]): [T, D].

        The T*K (token, expert) pairs are sorted by expert so that each expert
        sees one contiguous block of rows: one loop step per *used expert*.
        """
        top_k = expert_ids.shape[1]
        flat_ids = expert_ids.reshape(-1)  # [T*K]
        order = flat_ids.argsort(stable=True)  # [T*K] pair indices grouped by expert
        token_of = order // top_k  # [T*K] token of each sorted pair
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        rows = x[token_of]  # [T*K, D]
        out = torch.empty_like(rows)  # [T*K, D]
        start = 0
        for e, n in enumerate(counts):
            if n:
                out[start : start + n] = self._expert(e, rows[start : start + n])
                start += n
        out = out * weights.reshape(-1)[order, None].to(out.dtype)  # [T*K, D]
        return torch.zeros_like(x).index_add_(0, token_of, out)  # [T, D]

    def _expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, self.gate_up[e]).chunk(2, dim=-1)  # [n, I] each
        return F.linear(F.silu(gate) * up, self.down[e])  # [n, D]


class SparseMoE(nn.Module):
    """Router + experts (+ shared expert scaled by sigmoid(shared_expert_gate(x))). x [T, D] -> [T, D]."""

    def __init__(
        self,
        hidden_size: int,
        expert_intermediate_size: int,
        num_experts: int,
        top_k: int,
        norm_topk_prob: bool,
        shared_expert_intermediate_size: int = 0,
    ):
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, {num_experts}], got {top_k}")
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden_size, expert_intermediate_size)
        self.shared_expert: SwiGLU | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if shared_expert_intermediate_size:
            self.shared_expert = SwiGLU(hidden_size, shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights [T, K] (x's dtype) and expert ids [T, K] for x [T, D]."""
        logits = self.gate(x)  # [T, E]
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)  # [T, E]
        weights, ids = torch.topk(probs, self.top_k, dim=-1)  # [T, K]
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        out = self.experts(x, ids, weights)  # [T, D]
        if self.shared_expert is not None:
            shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)  # [T, D]
            out = out + shared
        return out
