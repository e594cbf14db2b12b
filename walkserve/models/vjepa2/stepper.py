"""The rollout's bookkeeping between predictor steps, as a stateless component (``forward_batch``).

    op "start"  features [C, F, E], actions [C+H-1, 7], states [C or C+H-1, 7]
                -> the prefill chunk of the C context steps (block-causal by step):
                   embeds [C*P, E], positions [3, C*P], token_kind [C*P]; pose [7] = s_{C-1}
    op "step"   (iteration h) logits [F, E] = the predictor's projected frame-token outputs,
                pose [7] = s_{C+h-1}, actions, states
                -> frame [F, E]: ẑ_{C+h} (layer-normed with no affine, in the request's dtype);
                   the next chunk, step t = C+h: [a_t, s_t, ẑ_{C+h}] (P = 2 + F rows), and pose s_t,
                   s_t = states[t] when the client gave every step's state, else
                   ``pose.next_pose(s_{t-1}, a_{t-1})`` (the released notebook's update);
                   at the last iteration (h = H-1) the chunk outputs are empty: nothing reads them.

Request params read: ``context_frames`` (C), ``horizon`` (H), ``dtype`` (of ``frame``).
"""

from __future__ import annotations

import torch

from walkserve.engines.spec import Batch
from walkserve.models.vjepa2.config import ACPredictorConfig
from walkserve.models.vjepa2.params import VJEPA2Params, VJEPA2Run, run_params
from walkserve.models.vjepa2.pose import next_pose
from walkserve.models.vjepa2.rollout import normalize_features
from walkserve.models.vjepa2.step_tokens import step_kinds, step_positions, step_rows

OUTPUT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CHUNK = ("embeds", "positions", "token_kind")


def output_dtype(params: VJEPA2Params) -> torch.dtype:
    return OUTPUT_DTYPES[params.dtype]


class StepChunks:
    """Builds one context's predictor chunks: step rows, their (t, row, col) positions and token kinds."""

    def __init__(self, config: ACPredictorConfig):
        self.config = config
        self._kinds = step_kinds(1, config.frame_tokens)  # [P]: one step's kinds, shared by every chunk

    def steps(self, first: int, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor) -> dict:
        """Steps ``first`` … ``first + S - 1`` of one context: frames [S, F, E], actions [S, 7], states [S, 7]."""
        s = frames.shape[0]
        return {
            "embeds": step_rows(frames.float(), actions.float(), states.float()),  # [S*P, E]
            "positions": step_positions(first, s, self.config.grid_size),  # [3, S*P]
            "token_kind": self._kinds.repeat(s),  # [S*P]
        }

    def members(self, t: int, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor) -> dict:
        """Step t of K contexts side by side (a fanned chunk): frames [K, F, E], actions [K, 7], states [K, 7]."""
        k = frames.shape[0]
        return {
            "embeds": step_rows(frames.float(), actions.float(), states.float()),  # [K*P, E]
            "positions": step_positions(t, 1, self.config.grid_size).repeat(1, k),  # [3, K*P]
            "token_kind": self._kinds.repeat(k),  # [K*P]
        }

    def empty(self) -> dict:
        e = self.config.input_size
        return {"embeds": torch.zeros(0, e), "positions": torch.zeros(3, 0, dtype=torch.long),
                "token_kind": torch.zeros(0, dtype=torch.long)}


class RolloutStepper:
    """Turns predictor outputs into the next rollout step's inputs (ops ``start`` and ``step``)."""

    def __init__(self, config: ACPredictorConfig):
        self.config = config
        self.chunks = StepChunks(config)

    def start(self, inputs: dict, params: VJEPA2Run) -> dict:
        features, actions, states = inputs["features"], inputs["actions"].float(), inputs["states"].float()
        c = features.shape[0]
        out = self.chunks.steps(0, features, actions[:c], states[:c])
        out["pose"] = states[c - 1]  # [7] float32, as the offline loop keeps poses
        return out

    def step(self, inputs: dict, params: VJEPA2Run, h: int) -> dict:
        c, horizon = params.context_frames, params.horizon
        actions, states = inputs["actions"].float(), inputs["states"].float()
        frame = normalize_features(inputs["logits"].float())  # [F, E]: ẑ_{C+h}
        out = {"frame": frame.to(output_dtype(params))}
        if h + 1 >= horizon:
            return {**out, **self.chunks.empty(), "pose": inputs["pose"]}
        t = c + h
        pose = states[t] if states.shape[0] > t else next_pose(inputs["pose"], actions[t - 1])  # [7]
        out.update(self.chunks.steps(t, frame[None], actions[t : t + 1], pose[None]))
        out["pose"] = pose
        return out

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        if batch.op == "start":
            return [self.start(f.inputs, run_params(f.params)) for f in batch]
        if batch.op == "step":
            return [self.step(f.inputs, run_params(f.params), f.iteration) for f in batch]
        raise ValueError(f"the rollout stepper has ops 'start' and 'step', not {batch.op!r}")
