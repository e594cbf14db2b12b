"""The next robot pose from a pose and an action, as the released V-JEPA 2-AC planner computes it.

A pose (state) is ``[x, y, z, rx, ry, rz, gripper]`` with extrinsic x-y-z Euler
angles (scipy's ``"xyz"``: R = Rz(rz) Ry(ry) Rx(rx)) and gripper closedness in
[0, 1]; an action is the same seven deltas. The next pose is

    xyz'     = xyz + Δxyz
    R'       = R(Δrx, Δry, Δrz) @ R(rx, ry, rz)       (the delta applied in the world frame)
    gripper' = clip(gripper + Δgripper, 0, 1)

with the angles of R' read back in the canonical range (rx, rz in [-π, π],
ry in [-π/2, π/2]; at ry = ±π/2 rx is set to 0). Computed in float64 and
returned in the pose's dtype, as the released code does through numpy.
"""

from __future__ import annotations

import torch

GIMBAL_EPS = 1e-9


def euler_to_matrix(angles: torch.Tensor) -> torch.Tensor:
    """Extrinsic x-y-z Euler angles [..., 3] -> rotation matrices [..., 3, 3] (Rz @ Ry @ Rx)."""
    c, s = angles.cos(), angles.sin()
    cx, cy, cz = c.unbind(-1)
    sx, sy, sz = s.unbind(-1)
    rows = (
        (cy * cz, sx * sy * cz - cx * sz, cx * sy * cz + sx * sz),
        (cy * sz, sx * sy * sz + cx * cz, cx * sy * sz - sx * cz),
        (-sy, sx * cy, cx * cy),
    )
    return torch.stack([torch.stack(row, dim=-1) for row in rows], dim=-2)  # [..., 3, 3]


def matrix_to_euler(r: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [..., 3, 3] -> extrinsic x-y-z Euler angles [..., 3] in the canonical range."""
    ry = torch.asin((-r[..., 2, 0]).clamp(-1.0, 1.0))
    regular = r[..., 2, 0].abs() < 1.0 - GIMBAL_EPS
    rx = torch.where(regular, torch.atan2(r[..., 2, 1], r[..., 2, 2]), torch.zeros_like(ry))
    rz = torch.where(regular, torch.atan2(r[..., 1, 0], r[..., 0, 0]), torch.atan2(-r[..., 0, 1], r[..., 1, 1]))
    return torch.stack([rx, ry, rz], dim=-1)


def next_pose(pose: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """pose [..., 7], action [..., 7] -> the pose after the action [..., 7] (pose's dtype and device)."""
    p, a = pose.to(torch.float64), action.to(torch.float64)
    xyz = p[..., :3] + a[..., :3]
    rotation = euler_to_matrix(a[..., 3:6]) @ euler_to_matrix(p[..., 3:6])  # [..., 3, 3]
    gripper = (p[..., 6:] + a[..., 6:]).clamp(0.0, 1.0)
    return torch.cat([xyz, matrix_to_euler(rotation), gripper], dim=-1).to(pose.dtype)
