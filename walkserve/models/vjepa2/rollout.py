"""Offline V-JEPA 2-AC rollouts over ``DenseAttention``: the released loop and the KV-reusing one.

Given C context frames z_0 … z_{C-1} (encoded, layer-normed: [C, F, E]),
actions a_0 … a_{C+H-2} and states s_0 … s_{C-1}, a rollout of horizon H
predicts ẑ_C … ẑ_{C+H-1}. Step t's tokens are [a_t, s_t, frame t]; the
predictor's output at frame t's tokens, projected and layer-normed, is the
next frame. States after the given ones follow ``pose.next_pose(s_t, a_t)``
unless the caller gives them all.

    official (the released notebook's loop, the benchmark's baseline):
        for each h: run the predictor on all C + h steps, keep the last F outputs
    cached (KV reuse):
        prefill the C context steps once (block-causal); then each step appends
        exactly 2 + F tokens [a_t, s_t, ẑ_t] and attends to the cache + itself

Both are exact: under the block-causal mask earlier steps' K/V never change.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from walkserve.layers.attention import DenseAttention
from walkserve.models.vjepa2.ac_predictor import ACPredictor
from walkserve.models.vjepa2.pose import next_pose
from walkserve.models.vjepa2.step_tokens import step_kinds, step_mask, step_positions, step_rows

KV = dict[int, tuple[torch.Tensor, torch.Tensor]]


def normalize_features(x: torch.Tensor) -> torch.Tensor:
    """The layer norm the released code applies to encoder and predicted frame tokens (no affine, eps 1e-5)."""
    return F.layer_norm(x, (x.shape[-1],))


def rollout_states(states: torch.Tensor, actions: torch.Tensor, steps: int) -> torch.Tensor:
    """States [steps, 7]: the given ones, then each next one from the last state and its action."""
    out = list(states[:steps].unbind(0))
    while len(out) < steps:
        t = len(out) - 1
        out.append(next_pose(out[t], actions[t]))
    return torch.stack(out)


class KVRollout:
    """One rollout context: the per-layer K/V of every step appended so far (DenseAttention's ``past``)."""

    def __init__(self, model: ACPredictor, kv: KV | None = None, steps: int = 0):
        self.model, self.kv, self.steps = model, kv or {}, steps

    def append(self, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """Append steps (frames [S, F, E], actions [S, 7], states [S, 7]); returns the next frame [F, E]."""
        cfg = self.model.config
        s = frames.shape[0]
        if self.steps + s > cfg.max_steps:
            raise ValueError(f"V-JEPA 2-AC: {self.steps + s} steps exceed the model's {cfg.max_steps}")
        device = frames.device
        attn = DenseAttention(step_mask(self.steps, s, cfg.tokens_per_step, device), past=self.kv, keep=True)
        hidden = self.model(
            None, step_positions(self.steps, s, cfg.grid_size, device), attn,
            inputs_embeds=step_rows(frames, actions, states), token_kind=step_kinds(s, cfg.frame_tokens, device),
        )  # [S * (2 + F), D]
        self.kv, self.steps = attn.kv, self.steps + s
        return normalize_features(self.model.compute_logits(hidden[-cfg.frame_tokens :]))  # [F, E]

    def fork(self) -> KVRollout:
        """A context that continues from this one; the K/V tensors are shared (``append`` never writes into them)."""
        return KVRollout(self.model, dict(self.kv), self.steps)


def full_forward(model: ACPredictor, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """The uncached forward over S whole steps under the block-causal mask: every step's prediction [S, F, E]."""
    cfg = model.config
    s, device = frames.shape[0], frames.device
    attn = DenseAttention(step_mask(0, s, cfg.tokens_per_step, device))
    hidden = model(None, step_positions(0, s, cfg.grid_size, device), attn,
                   inputs_embeds=step_rows(frames, actions, states), token_kind=step_kinds(s, cfg.frame_tokens, device))
    frame_rows = hidden.view(s, cfg.tokens_per_step, -1)[:, -cfg.frame_tokens :]  # [S, F, D]
    return normalize_features(model.compute_logits(frame_rows))  # [S, F, E]


def official_rollout(model: ACPredictor, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor,
                     horizon: int) -> torch.Tensor:
    """The released loop: re-run the predictor on the whole history each step. Returns [H, F, E]."""
    c = _check(model, frames, actions, states, horizon)
    states = rollout_states(states, actions, c + horizon - 1)
    history = list(frames.unbind(0))
    for h in range(horizon):
        steps = c + h
        predicted = full_forward(model, torch.stack(history), actions[:steps], states[:steps])[-1]  # [F, E]
        history.append(predicted)
    return torch.stack(history[c:])


def cached_rollout(model: ACPredictor, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor,
                   horizon: int, on_step: Callable[[int, torch.Tensor], None] | None = None) -> torch.Tensor:
    """Prefill the context, then append one step per predicted frame. Returns [H, F, E]; ``on_step(h, frame)`` streams."""
    c = _check(model, frames, actions, states, horizon)
    states = rollout_states(states, actions, c + horizon - 1)
    context = KVRollout(model)
    frame = context.append(frames, actions[:c], states[:c])  # [F, E]: ẑ_C
    out = [frame]
    if on_step is not None:
        on_step(0, frame)
    for h in range(1, horizon):
        t = c + h - 1
        frame = context.append(frame[None], actions[t : t + 1], states[t : t + 1])
        out.append(frame)
        if on_step is not None:
            on_step(h, frame)
    return torch.stack(out)


def _check(model: ACPredictor, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor, horizon: int) -> int:
    cfg = model.config
    c = frames.shape[0]
    need = c + horizon - 1
    if frames.dim() != 3 or frames.shape[1:] != (cfg.frame_tokens, cfg.input_size):
        raise ValueError(f"frames must be [C, {cfg.frame_tokens}, {cfg.input_size}], got {tuple(frames.shape)}")
    if horizon < 1 or need > cfg.max_steps:
        raise ValueError(f"horizon {horizon} with {c} context frames needs {need} steps; the model has {cfg.max_steps}")
    if actions.shape[0] < need or states.shape[0] < c:
        raise ValueError(f"a rollout of {horizon} from {c} frames needs {need} actions and >= {c} states, "
                         f"got {actions.shape[0]} and {states.shape[0]}")
    return c
