"""V-JEPA 2's 3-D rotary embedding: depth, height and width parts of each head, adjacent-dim pairs, tiled angles.

A head of ``Dh`` dims splits into three parts of ``d = 2 * floor(floor(Dh / 3) / 2)``
dims and an unrotated tail (Dh 64: 20 + 20 + 20 + 4; Dh 80: 26 x 3 + 2):

    dims  [0, d)        rotate by the token's depth (frame) position t
          [d, 2d)       ... by its row
          [2d, 3d)      ... by its column
          [3d, Dh)      unchanged

Each part uses ``tiled_angles`` (frequencies ``1/10000^(i/(d/2))`` laid out
``[f0 … f(d/2-1), f0 … f(d/2-1)]``) and ``apply_rotary_adjacent`` (pairs are
adjacent dims). Positions are a LongTensor ``[3, T]`` of (t, row, col); a
position of 0 on an axis leaves that part unchanged, which is how the AC
predictor's action and state tokens rotate only their depth part.
"""

from __future__ import annotations

import torch

from walkserve.layers.rope import tiled_angles

AXES = 3  # depth, height, width


def part_dim(head_dim: int) -> int:
    """Dims of each of the three rotated parts of a head."""
    return 2 * ((head_dim // 3) // 2)


class Rope3D:
    """cos/sin [T, Dh] (float32) for positions [3, T]; holds no parameters."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        self.head_dim, self.theta = head_dim, theta
        self.part = part_dim(head_dim)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions LongTensor [3, T] of (t, row, col) -> cos, sin [T, Dh] float32."""
        if positions.dim() != 2 or positions.shape[0] != AXES:
            raise ValueError(f"V-JEPA 2 positions must be [3, T] (t, row, col), got {tuple(positions.shape)}")
        t = positions.shape[1]
        parts = [tiled_angles(positions[axis], self.part, self.theta) for axis in range(AXES)]  # 3 x [T, d]
        tail = torch.zeros(t, self.head_dim - AXES * self.part, device=positions.device)  # [T, Dh - 3d]
        angles = torch.cat([*parts, tail], dim=-1)  # [T, Dh]
        return angles.cos(), angles.sin()


def grid_positions(frames: int, rows: int, cols: int, device: torch.device | str | None = None) -> torch.Tensor:
    """LongTensor [3, frames * rows * cols]: (t, row, col) of every token of a grid, in raster order."""
    t, r, c = torch.meshgrid(
        torch.arange(frames, device=device), torch.arange(rows, device=device), torch.arange(cols, device=device),
        indexing="ij",
    )
    return torch.stack([t.reshape(-1), r.reshape(-1), c.reshape(-1)])  # [3, N]


def index_positions(ids: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """LongTensor [3, *ids.shape]: (t, row, col) of raster token indices ``ids`` on a rows x cols grid."""
    per_frame = rows * cols
    return torch.stack([ids // per_frame, (ids % per_frame) // cols, ids % cols])
