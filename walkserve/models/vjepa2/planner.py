"""CEM planning as a stateless component (``forward_batch``): the bookkeeping around the batched predictor steps.

One CEM iteration of a request is K candidate rollouts of H steps, run as K
contexts ``cand[0..K-1]`` of the request, each step one fanned predictor
firing (``graph.py``). Everything CEM keeps between firings travels as
tensors (the distribution, the generator state, the candidates and their
poses), so the component holds no per-request state:

    op "start"   -> dist [2, H, 4] (mean, std over Δxyz, Δgripper), rng (the seeded generator's state)
    op "sample"  dist, rng, features [1, F, E] (z_{C-1}), states [C, 7]
                 -> candidates [K, H, 7], the first step's fanned chunk (step t = C-1 of every
                    candidate: [a_0^k, s_{C-1}, z_{C-1}], K x P rows), k = reset = [K], poses [K, 7], rng
    op "roll"    (inner iteration h) logits [K*F, E], candidates, poses (s_{C-1+h} per candidate), goal
                 -> frames [K, F, E] (ẑ, layer-normed), the next fanned chunk (empty after the last
                    step), k, reset = [0], poses; costs [K] = mean L1 of the last frame to the goal
                    (at the last step; empty before)
    op "refit"   costs [K], candidates, dist (and frames [H*K, F, E], accumulated over the steps)
                 -> dist (top-k refit with the released momenta), cost [2] = (best, top-k mean),
                    first_action [7] (the refit mean's first action, small Δgripper rounded to 0),
                    features [H, F, E] (the best candidate's predicted frames)

Sampling, refit and answer are ``cem.py``'s, drawn from one generator seeded
by ``seed`` whose state is carried from iteration to iteration, so a served
plan draws exactly the candidates the offline ``cem.plan`` draws.
"""

from __future__ import annotations

import torch

from walkserve.engines.spec import Batch
from walkserve.models.vjepa2.cem import (
    CEMConfig,
    answer,
    initial_distribution,
    l1_cost,
    refit,
    sample_candidates,
)
from walkserve.models.vjepa2.config import ACPredictorConfig
from walkserve.models.vjepa2.params import VJEPA2Params, VJEPA2Run, run_params
from walkserve.models.vjepa2.pose import next_pose
from walkserve.models.vjepa2.rollout import normalize_features
from walkserve.models.vjepa2.stepper import StepChunks, output_dtype

CEM_PARAMS = ("horizon", "samples", "topk", "iterations", "momentum_mean", "momentum_std", "momentum_mean_gripper",
              "momentum_std_gripper", "maxnorm", "gripper_max", "gripper_round", "seed")


def cem_config(params: VJEPA2Params) -> CEMConfig:
    """The request's CEM parameters (defaults: the released planner's)."""
    return CEMConfig(**{name: getattr(params, name) for name in CEM_PARAMS if getattr(params, name) is not None})


class Planner:
    """The CEM steps of many requests (ops ``start``, ``sample``, ``roll``, ``refit``)."""

    def __init__(self, config: ACPredictorConfig):
        self.config = config
        self.chunks = StepChunks(config)

    def start(self, inputs: dict, params: VJEPA2Run, h: int) -> dict:
        config = cem_config(params)
        mean, std = initial_distribution(config)
        return {"dist": torch.stack([mean, std]), "rng": torch.Generator().manual_seed(config.seed).get_state()}

    def sample(self, inputs: dict, params: VJEPA2Run, h: int) -> dict:
        config = cem_config(params)
        gen = torch.Generator()
        gen.set_state(inputs["rng"])
        dist = inputs["dist"]
        frame, state = inputs["features"][-1], inputs["states"][-1].float()  # z_{C-1} [F, E], s_{C-1} [7]
        cands = sample_candidates(dist[0], dist[1], config, gen)  # [K, H, 7]
        k = cands.shape[0]
        poses = state[None].expand(k, -1).clone()  # [K, 7]
        out = self.chunks.members(params.context_frames - 1, frame[None].expand(k, -1, -1), cands[:, 0], poses)
        return {**out, "candidates": cands, "poses": poses, "rng": gen.get_state(), "dist": dist,
                "k": torch.tensor([k]), "reset": torch.tensor([k])}

    def roll(self, inputs: dict, params: VJEPA2Run, h: int) -> dict:
        cands, poses = inputs["candidates"], inputs["poses"]
        k, horizon = cands.shape[0], cands.shape[1]
        frames = normalize_features(inputs["logits"].float().view(k, self.config.frame_tokens, -1))  # [K, F, E]
        out = {"frames": frames, "reset": torch.tensor([0])}
        if h + 1 >= horizon:
            costs = l1_cost(frames, inputs["goal"][-1].float())  # [K]
            return {**out, **self.chunks.empty(), "k": torch.tensor([k]), "poses": poses, "costs": costs}
        poses = next_pose(poses, cands[:, h])  # [K, 7]: s_{C+h} of each candidate
        out.update(self.chunks.members(params.context_frames + h, frames, cands[:, h + 1], poses))
        return {**out, "k": torch.tensor([k]), "poses": poses, "costs": torch.zeros(0)}

    def refit(self, inputs: dict, params: VJEPA2Run, h: int) -> dict:
        config = cem_config(params)
        costs, cands, dist = inputs["costs"], inputs["candidates"], inputs["dist"]
        order = costs.argsort()
        elite = order[: config.topk]
        mean, std = refit(dist[0], dist[1], cands[elite].cpu().float(), config)
        out = {"dist": torch.stack([mean, std]), "cost": torch.stack([costs[order[0]], costs[elite].mean()]),
               "first_action": answer(mean, config)[0]}
        if "frames" in inputs:  # [H*K, F, E], step-major: the best candidate's frame of every step
            k = cands.shape[0]
            best = inputs["frames"].view(-1, k, *inputs["frames"].shape[1:])[:, order[0]]  # [H, F, E]
            out["features"] = best.to(output_dtype(params))
        return out

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        ops = {"start": self.start, "sample": self.sample, "roll": self.roll, "refit": self.refit}
        if batch.op not in ops:
            raise ValueError(f"the CEM planner has ops {', '.join(ops)}, not {batch.op!r}")
        out = []
        for f in batch:
            result = ops[batch.op](f.inputs, run_params(f.params), f.iteration)
            out.append({name: result[name] for name in f.outputs})
        return out
