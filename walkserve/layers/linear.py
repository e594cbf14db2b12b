"""Linear layers: ``Linear`` (``nn.Linear`` through the CPU-aware ``linear``) and ``FusedLinear``,
several projections of one input computed as one matmul (q/k/v, gate/up).

The checkpoint stores the parts separately (``q_proj.weight``, ``k_proj.weight``
...). A module whose parameters do not match checkpoint names one to one
says so through ``checkpoint_parts(prefix)``: checkpoint tensor name ->
(its own parameter name, index of the slice that tensor fills). Loaders
(``walkserve.models.common.checkpoint``) use it; every other parameter maps to
the checkpoint tensor of the same qualified name.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from walkserve.layers.cpu_linear import linear

# checkpoint tensor name -> (parameter name on the module, index into that parameter)
CheckpointParts = dict[str, tuple[str, tuple[int | slice, ...]]]


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and checkpoint names) computed through ``linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class FusedLinear(Linear):
    """One ``nn.Linear`` whose output rows are the concatenation of named sibling projections.

    ``parts`` lists (checkpoint module name, out_features) in output order;
    a part named ``q_proj`` of a module at ``layers.0.self_attn.qkv_proj`` is
    read from ``layers.0.self_attn.q_proj.weight`` (and ``.bias``).
    """

    def __init__(self, in_features: int, parts: Sequence[tuple[str, int]], bias: bool = False):
        self.parts = tuple((name, int(size)) for name, size in parts)
        super().__init__(in_features, sum(size for _, size in self.parts), bias=bias)

    @property
    def sizes(self) -> list[int]:
        return [size for _, size in self.parts]

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The per-part views of an output y [..., sum(sizes)]."""
        return y.split(self.sizes, dim=-1)

    def checkpoint_parts(self, prefix: str) -> CheckpointParts:
        parent = prefix.rpartition(".")[0]
        parent = f"{parent}." if parent else ""
        out: CheckpointParts = {}
        start = 0
        for name, size in self.parts:
            rows = (slice(start, start + size),)
            out[f"{parent}{name}.weight"] = ("weight", rows)
            if self.bias is not None:
                out[f"{parent}{name}.bias"] = ("bias", rows)
            start += size
        return out
