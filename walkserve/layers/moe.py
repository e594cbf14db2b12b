"""Sparse mixture of experts: softmax router, top-k experts, optional gated shared expert.

Qwen2-MoE / Qwen3-MoE / Qwen3-Omni layout. Checkpoint names (one tensor per expert):

    mlp.gate.weight                         [E, D]    router
    mlp.experts.{e}.gate_proj.weight        [I, D]
    mlp.experts.{e}.up_proj.weight          [I, D]
    mlp.experts.{e}.down_proj.weight        [D, I]
    mlp.shared_expert.{gate,up,down}_proj.weight      (optional)
    mlp.shared_expert_gate.weight           [1, D]    (optional)

The experts are held stacked (``gate_up [E, 2I, D]``, ``down [E, D, I]``), filled
from the per-expert tensors at load (``Experts.checkpoint_parts``).

How a layer runs, with no host sync and no Python loop over experts:

    ids [T, K] --sort--> the T*K (token, expert) pairs grouped by expert
                         ends[e] = where expert e's rows stop (searchsorted, on the device)
    rows = x[token of each sorted pair]                              [T*K, D]
    h    = grouped_mm(rows, gate_up, ends) -> silu(gate) * up       [T*K, I]
    out  = grouped_mm(h, down, ends) * routing weight                [T*K, D]
    y    = out put back in pair order, summed over the K pairs        [T, D]

``grouped_mm`` is torch's grouped GEMM (``torch.nn.functional.grouped_mm``):
one kernel for all experts, CUTLASS on CUDA (SM80+, bf16) and a native kernel
on the CPU (float32 / bf16 / fp16). Every shape depends only on T*K, so the path
can be captured in a CUDA graph. The put-back is a permutation and a sum, not
an atomic scatter-add, so results do not depend on thread timing.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.linear import CheckpointParts
from walkserve.layers.mlp import SwiGLU

GROUPED_MM_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows of x [N, K] grouped by expert times each expert's weight [E, M, K]: [N, M].

    ``ends`` [E] int32: expert e owns rows ``ends[e-1] .. ends[e]`` (``ends[-1]`` = N:
    every row belongs to an expert).
    """
    if _grouped_mm_supported(x, weight):
        return F.grouped_mm(x, weight.transpose(-2, -1), offs=ends)  # weight as [E, K, M], column-major
    return _grouped_linear_reference(x, weight, ends)


def _grouped_mm_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if not hasattr(F, "grouped_mm") or x.dtype != weight.dtype:
        return False
    if weight.device.type == "cuda":
        # CUDA path (not run by the CPU test suite): torch's CUTLASS grouped GEMM, bf16 on SM80+.
        return weight.dtype == torch.bfloat16 and _cuda_capability(weight.device.index) >= (8, 0)
    return weight.device.type == "cpu" and weight.dtype in GROUPED_MM_CPU_DTYPES


@lru_cache(maxsize=16)
def _cuda_capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _grouped_linear_reference(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """The same function one expert at a time, for dtypes/devices grouped_mm lacks (float64, fp32 on CUDA).

    Reads the group sizes on the host (a sync): a reference path, not a serving one.
    """
    out = x.new_zeros(x.shape[0], weight.shape[1])  # [N, M]
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            out[start:end] = F.linear(x[start:end], weight[e])
        start = end
    return out


class Experts(nn.Module):
    """E SwiGLU experts with stacked weights, run as two grouped matmuls over the routed rows."""

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
        """x [T, D], expert_ids / weights [T, K] -> sum_k weights[t, k] * expert_{ids[t, k]}(x[t]): [T, D]."""
        t, k = expert_ids.shape
        if t == 0:
            return torch.zeros_like(x)
        sorted_ids, order = torch.sort(expert_ids.reshape(-1), stable=True)  # [T*K] pairs grouped by expert
        bounds = torch.arange(1, self.num_experts + 1, device=x.device, dtype=sorted_ids.dtype)  # [E]
        ends = torch.searchsorted(sorted_ids, bounds, out_int32=True)  # [E] end row of each expert's group
        rows = x[order // k]  # [T*K, D]
        gate, up = grouped_linear(rows, self.gate_up, ends).chunk(2, dim=-1)  # [T*K, I] each
        out = grouped_linear(F.silu(gate) * up, self.down, ends)  # [T*K, D]
        out = out * weights.reshape(-1)[order, None].to(out.dtype)  # [T*K, D]
        in_pair_order = torch.empty_like(out).index_copy_(0, order, out)  # [T*K, D], row t*K + k
        return in_pair_order.view(t, k, -1).sum(dim=1)  # [T, D]


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
