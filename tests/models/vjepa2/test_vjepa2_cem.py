"""CEM planning: the released planner's defaults, reproducibility, and costs equal to rolling each candidate out alone."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from walkserve.models.vjepa2.cem import CEMConfig, l1_cost, plan
from walkserve.models.vjepa2.pose import euler_to_matrix, matrix_to_euler, next_pose
from walkserve.models.vjepa2.rollout import official_rollout

SMALL = CEMConfig(samples=12, topk=4, iterations=3, seed=7)


def test_defaults_are_the_released_planners():
    c = CEMConfig()
    assert (c.horizon, c.samples, c.topk, c.iterations) == (2, 400, 10, 10)
    assert (c.momentum_mean, c.momentum_std, c.momentum_mean_gripper, c.momentum_std_gripper) == (0.15,) * 4
    assert (c.maxnorm, c.gripper_max) == (0.05, 0.75)
    with pytest.raises(ValueError):
        CEMConfig(samples=4, topk=5)


@pytest.fixture(scope="module")
def planned(released, ac_inputs):
    frames, _, states = ac_inputs
    goal = frames[5]
    with torch.inference_mode():
        return plan(released.predictor, frames[:1], states[:1], goal, SMALL, return_features=True)


def test_plan_is_reproducible_and_seeded(released, ac_inputs, planned):
    frames, _, states = ac_inputs
    with torch.inference_mode():
        again = plan(released.predictor, frames[:1], states[:1], frames[5], SMALL, return_features=True)
        other = plan(released.predictor, frames[:1], states[:1], frames[5], dataclasses.replace(SMALL, seed=8))
    for field in ("actions", "best_cost", "topk_cost", "candidates", "costs", "features"):
        assert torch.equal(getattr(planned, field), getattr(again, field)), field
    assert not torch.equal(planned.candidates, other.candidates)


def test_plan_result_shapes_and_sampling_bounds(planned):
    p = planned
    assert p.actions.shape == (2, 7) and torch.equal(p.first_action, p.actions[0])
    assert p.best_cost.shape == p.topk_cost.shape == (3,) and (p.best_cost <= p.topk_cost).all()
    assert p.candidates.shape == (12, 2, 7) and p.costs.shape == (12,) and p.features.shape == (2, 16, 128)
    assert p.candidates[..., :3].abs().max() <= 0.05 and p.candidates[..., 6].abs().max() <= 0.75
    assert p.candidates[..., 3:6].eq(0).all() and p.actions[:, 3:6].eq(0).all()
    grip = p.actions[:, 6]
    assert ((grip == 0) | (grip.abs() >= 0.25)).all()  # small gripper means are rounded to 0
    assert math.isclose(float(p.best_cost[-1]), float(p.costs.min()), rel_tol=1e-6)


@pytest.mark.parametrize("context", [1, 3])
def test_costs_are_those_of_each_candidate_rolled_out_alone(released, ac_inputs, context):
    """Each candidate's cost = the released (uncached) loop on that candidate's actions, scored against the goal."""
    frames, actions, states = ac_inputs
    goal = frames[9]
    config = dataclasses.replace(SMALL, samples=6, topk=3, iterations=2)
    with torch.inference_mode():
        p = plan(released.predictor, frames[:context], states[:context], goal, config, actions=actions[: context - 1],
                 return_features=True)
        for k in range(config.samples):
            seq = torch.cat([actions[: context - 1], p.candidates[k]])
            rolled = official_rollout(released.predictor, frames[:context], seq, states[:context], config.horizon)
            assert math.isclose(float(l1_cost(rolled[-1], goal)), float(p.costs[k]), rel_tol=1e-5, abs_tol=1e-6)
            if k == int(p.costs.argmin()):
                assert (rolled - p.features).abs().max() <= 1e-4


def test_pose_composes_rotations_in_the_world_frame():
    g = torch.Generator().manual_seed(0)
    angles = torch.stack([torch.rand(64, generator=g) * 6 - 3, torch.rand(64, generator=g) * 3 - 1.5,
                          torch.rand(64, generator=g) * 6 - 3], dim=-1).double()
    assert torch.allclose(matrix_to_euler(euler_to_matrix(angles)), angles, atol=1e-9)  # canonical range round trip
    pose = torch.cat([torch.randn(64, 3, generator=g), angles, torch.rand(64, 1, generator=g)], dim=-1).double()
    action = torch.cat([0.05 * torch.randn(64, 6, generator=g), torch.randn(64, 1, generator=g)], dim=-1).double()
    new = next_pose(pose, action)
    assert torch.allclose(new[:, :3], pose[:, :3] + action[:, :3])
    assert torch.allclose(euler_to_matrix(new[:, 3:6]),
                          euler_to_matrix(action[:, 3:6]) @ euler_to_matrix(pose[:, 3:6]), atol=1e-9)
    assert torch.equal(new[:, 6], (pose[:, 6] + action[:, 6]).clamp(0, 1))
    z = next_pose(torch.tensor([0, 0, 0, 0, 0, 0.1, 0.5]), torch.tensor([0, 0, 0, 0, 0, 0.2, 0.7]))
    assert torch.allclose(z, torch.tensor([0, 0, 0, 0, 0, 0.3, 1.0]), atol=1e-6) and z.dtype == torch.float32
    x = matrix_to_euler(euler_to_matrix(torch.tensor([[0.3, math.pi / 2, 0.0]], dtype=torch.float64)))
    assert torch.allclose(euler_to_matrix(x), euler_to_matrix(torch.tensor([[0.3, math.pi / 2, 0.0]]).double()),
                          atol=1e-7)  # gimbal lock: another triple, the same rotation
