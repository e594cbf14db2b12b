"""CEM planning over action sequences with the AC predictor, as the released planner does (``mpc_utils.cem``).

Each iteration draws K candidate sequences of H actions from a diagonal
Gaussian over (Δx, Δy, Δz, Δgripper) per step (Δrotation is 0), clips Δxyz
to ±maxnorm and Δgripper to ±gripper_max, rolls every candidate out with
pose-integrated states, scores it by the mean L1 distance between its last
predicted frame and the goal's features, and refits mean and std to the
top-k with momentum. The answer is the final mean (Δgripper below
``gripper_round`` in magnitude rounded to 0), as the released planner returns.

KV reuse: every candidate forks one shared context. Step t's tokens start
with action_t, so only the steps *before* the last context frame are common
to all candidates; with the released single context frame that prefix is
empty and each candidate prefills its own first step.

Reproducible: all sampling draws from one CPU generator seeded by ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from walkserve.models.vjepa2.ac_predictor import ACPredictor
from walkserve.models.vjepa2.pose import next_pose
from walkserve.models.vjepa2.rollout import KVRollout


@dataclass(frozen=True)
class CEMConfig:
    """The planner's parameters; defaults follow the released planner (``world_model_wrapper``)."""

    horizon: int = 2
    samples: int = 400
    topk: int = 10
    iterations: int = 10
    momentum_mean: float = 0.15
    momentum_std: float = 0.15
    momentum_mean_gripper: float = 0.15
    momentum_std_gripper: float = 0.15
    maxnorm: float = 0.05
    gripper_max: float = 0.75
    gripper_round: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.horizon, self.samples, self.iterations) < 1 or not 2 <= self.topk <= self.samples:
            raise ValueError(f"CEM needs horizon, samples, iterations >= 1 and 2 <= topk <= samples, got {self}")


@dataclass
class PlanResult:
    """What a plan returns. ``actions`` is the planner's answer; the rest explains it."""

    actions: torch.Tensor  # [H, 7] the final mean sequence (Δrotation 0, small Δgripper rounded to 0)
    best_cost: torch.Tensor  # [I] the lowest candidate cost of each iteration: the cost curve
    topk_cost: torch.Tensor  # [I] the mean cost of each iteration's top-k
    candidates: torch.Tensor  # [K, H, 7] the last iteration's candidate sequences
    costs: torch.Tensor  # [K] their costs
    features: torch.Tensor | None = None  # [H, F, E] the last iteration's best candidate's predicted frames

    @property
    def first_action(self) -> torch.Tensor:
        """[7]: the action to execute now."""
        return self.actions[0]


def l1_cost(frame: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference over every token and channel: frames [..., F, E] vs goal [F, E] -> [...]."""
    return (frame - goal).abs().flatten(-2).mean(-1)


def plan(model: ACPredictor, frames: torch.Tensor, states: torch.Tensor, goal: torch.Tensor,
         config: CEMConfig = CEMConfig(), actions: torch.Tensor | None = None,
         return_features: bool = False) -> PlanResult:
    """Plan ``config.horizon`` actions from context frames [C, F, E] (states [C, 7], the C - 1 actions
    between them) toward a goal frame's features [F, E]."""
    c = frames.shape[0]
    if goal.shape != frames.shape[1:] or states.shape[0] < c or (c > 1 and (actions is None or len(actions) < c - 1)):
        raise ValueError(f"plan from {c} frames {tuple(frames.shape[1:])} needs a goal of that shape, {c} states "
                         f"and {c - 1} actions")
    if c + config.horizon - 1 > model.config.max_steps:
        raise ValueError(f"{c} context frames + horizon {config.horizon} exceed {model.config.max_steps} steps")
    actions = frames.new_zeros(0, 7) if actions is None else actions
    prefix = KVRollout(model)
    if c > 1:  # steps 0 … C-2 do not depend on any candidate
        prefix.append(frames[:-1], actions[: c - 1], states[: c - 1])
    gen = torch.Generator().manual_seed(config.seed)
    mean, std = initial_distribution(config)
    best, topk_mean = [], []
    for _ in range(config.iterations):
        candidates = sample_candidates(mean, std, config, gen).to(frames.device, frames.dtype)  # [K, H, 7]
        costs, features = _score(prefix, frames[-1], states[c - 1], goal, candidates, return_features)
        order = costs.argsort()
        best.append(costs[order[0]])
        topk_mean.append(costs[order[: config.topk]].mean())
        mean, std = refit(mean, std, candidates[order[: config.topk]].cpu().float(), config)
    return PlanResult(answer(mean, config), torch.stack(best), torch.stack(topk_mean), candidates, costs, features)


def _score(prefix: KVRollout, frame: torch.Tensor, state: torch.Tensor, goal: torch.Tensor,
           candidates: torch.Tensor, keep_best: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each candidate's cost [K] (float32, CPU) and, if asked, the lowest-cost candidate's predictions [H, F, E]."""
    costs = torch.empty(candidates.shape[0])
    best = None
    for k, seq in enumerate(candidates):
        predicted = _rollout(prefix, frame, state, seq)  # [H, F, E]
        costs[k] = l1_cost(predicted[-1], goal).float().cpu()
        if keep_best and (best is None or costs[k] < costs[best[0]]):
            best = (k, predicted)
    return costs, None if best is None else best[1]


def _rollout(prefix: KVRollout, frame: torch.Tensor, state: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """One candidate from the shared prefix: the last context frame, then its own predictions. [H, F, E]."""
    context = prefix.fork()
    out = []
    for action in seq:
        frame = context.append(frame[None], action[None], state[None])  # [F, E]
        out.append(frame)
        state = next_pose(state, action)
    return torch.stack(out)


def initial_distribution(config: CEMConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """mean 0, std (maxnorm x 3, 1) over (Δx, Δy, Δz, Δgripper) for each step: [H, 4] each."""
    mean = torch.zeros(config.horizon, 4)
    std = torch.cat([torch.full((config.horizon, 3), config.maxnorm), torch.ones(config.horizon, 1)], dim=-1)
    return mean, std


def sample_candidates(mean: torch.Tensor, std: torch.Tensor, config: CEMConfig, gen: torch.Generator) -> torch.Tensor:
    """K sequences [K, H, 7]: clipped Gaussian Δxyz and Δgripper, zero Δrotation."""
    draw = torch.randn(config.samples, *mean.shape, generator=gen) * std + mean  # [K, H, 4]
    xyz = draw[..., :3].clamp(-config.maxnorm, config.maxnorm)
    grip = draw[..., 3:].clamp(-config.gripper_max, config.gripper_max)
    return torch.cat([xyz, torch.zeros_like(xyz), grip], dim=-1)  # [K, H, 7]


def refit(mean: torch.Tensor, std: torch.Tensor, elite: torch.Tensor, config: CEMConfig):
    """New mean/std [H, 4] from the top-k sequences [k, H, 7], with the released momenta."""
    picked = torch.cat([elite[..., :3], elite[..., 6:]], dim=-1)  # [k, H, 4]
    m_new, s_new = picked.mean(0), picked.std(0)
    m_keep = torch.tensor([config.momentum_mean] * 3 + [config.momentum_mean_gripper])
    s_keep = torch.tensor([config.momentum_std] * 3 + [config.momentum_std_gripper])
    return m_new * (1 - m_keep) + mean * m_keep, s_new * (1 - s_keep) + std * s_keep


def answer(mean: torch.Tensor, config: CEMConfig) -> torch.Tensor:
    grip = mean[:, 3:].masked_fill(mean[:, 3:].abs() < config.gripper_round, 0.0)
    return torch.cat([mean[:, :3], torch.zeros(mean.shape[0], 3), grip], dim=-1)  # [H, 7]
