"""One action chunk end to end, offline: the reference the served walks are compared with.

    prepare_request -> camera pixels -> vision -> compact prefix -> PaliGemma (K/V kept)
    -> pi0: state token -> flow (10 expert steps) -> finish_actions
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from walkserve.models.pi0.files import PolicyFiles
from walkserve.models.pi0.flow import PrefixKV, append_state, compute_prefix, sample_actions
from walkserve.models.pi0.images import camera_pixels
from walkserve.models.pi0.inputs import PolicyInputs
from walkserve.models.pi0.policy import Pi0Policy
from walkserve.models.pi0.prefix import compact_prefix
from walkserve.models.pi0.request import PreparedRequest, finish_actions, prepare_request


@dataclass
class Prediction:
    actions: np.ndarray  # [H, action_dim], unnormalised
    chunk: torch.Tensor  # [H, 32], the flow's output
    velocities: list[torch.Tensor] = field(default_factory=list)  # [H, 32] per step
    context: PrefixKV | None = None
    request: PreparedRequest | None = None


def camera_batch(request: PreparedRequest, resolution: int, device: torch.device) -> torch.Tensor:
    """The request's cameras as SigLIP pixels [n, 3, R, R] in [-1, 1]."""
    return torch.stack([camera_pixels(img, resolution) for img in request.images]).to(device)


@torch.no_grad()
def prefix_context(policy: Pi0Policy, request: PreparedRequest) -> PrefixKV:
    """The request's prefix K/V (and pi0's state token), computed once."""
    device = policy.lm.embed_tokens.weight.device
    features = policy.vision(camera_batch(request, policy.config.image_resolution[0], device))  # [n, P, D]
    ids = torch.tensor(request.token_ids, dtype=torch.long, device=device)
    ctx = compute_prefix(policy.lm, compact_prefix(policy.lm, features.reshape(-1, features.shape[-1]), ids))
    if request.state is not None:
        ctx = append_state(policy.expert, ctx, torch.from_numpy(request.state).to(device))
    return ctx


@torch.no_grad()
def predict_actions(policy: Pi0Policy, files: PolicyFiles, inputs: PolicyInputs,
                    generator: torch.Generator | None = None) -> Prediction:
    config = policy.config
    request = prepare_request(files, inputs)
    ctx = prefix_context(policy, request)
    device = policy.lm.embed_tokens.weight.device
    if request.noise is not None:
        noise = torch.from_numpy(request.noise)
    else:
        noise = torch.randn(config.chunk_size, config.max_action_dim, generator=generator)
    trace: list[torch.Tensor] = []
    chunk = sample_actions(policy.expert, ctx, noise.to(device), config.num_inference_steps, trace)
    actions = finish_actions(files, chunk.cpu().numpy())
    return Prediction(actions, chunk, trace, ctx, request)
