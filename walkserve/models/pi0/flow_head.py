"""FlowHead: the flow's arithmetic around the action expert, a stateless component.

The expert (a KV-cache component) turns action tokens into hidden states over
the request's prefix; everything else of a flow step is small and per request,
and runs here, batched over every request the engine hands over at once:

    start   noise [H, 32]                 -> x = noise, embeds = embed_actions(x, 1), time = 1   [H]
    step    hidden [H, W], x [H, 32]      -> v = action_out_proj(hidden)                     (step k = the
                                             x = x - v / K,  t = 1 - (k+1) / K                 loop iteration)
                                             embeds = embed_actions(x, t), time = t           [H]
    finish  x [H, 32]                     -> actions [H, action_dim]: sliced, unnormalised
    state   state [32] (pi0)              -> embeds = state_proj(state) [1, W]   (its ``after`` input only orders it
                                             behind the prefix; its value is not read)

``embed_actions`` is the expert's own (``ActionTokens``): pi0.5's tokens are
``action_in_proj(x)`` alone, pi0's mix in the time features.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from walkserve.engines.spec import Batch
from walkserve.models.pi0.action_expert import ActionTokens
from walkserve.models.pi0.config import PolicyConfig
from walkserve.models.pi0.flow import euler_step, flow_times
from walkserve.models.pi0.normalizer import Normalizer

START, STEP, FINISH, STATE = "start", "step", "finish", "state"
OPS = (START, STEP, FINISH, STATE)


class FlowHead(nn.Module, ActionTokens):
    """Parameter names are the checkpoint's root names (``action_in_proj.*`` ...), like the expert's projections."""

    def __init__(self, config: PolicyConfig, normalizer: Normalizer):
        super().__init__()
        self.add_projections(config, config.expert.hidden_size)
        self.num_steps = config.num_inference_steps
        self.action_dim = config.action_dim
        self.normalizer = normalizer

    @property
    def device(self) -> torch.device:
        return self.action_in_proj.weight.device

    @torch.inference_mode()
    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        """One dict of outputs per item, in order (every item of a batch is of one op)."""
        if not batch.items:
            return []
        items, op = batch.items, batch.op
        if op not in OPS:
            raise ValueError(f"the flow head has no op {op!r} (ops: {', '.join(OPS)})")
        if op == FINISH:
            return [{"actions": self.finish(f.inputs["x"])} for f in items]
        if op == STATE:
            embeds = self.embed_state(torch.stack([self._on(f.inputs["state"]).reshape(-1) for f in items]))
            return [{"embeds": e[None]} for e in embeds]  # [1, W] each
        if op == START:
            x = [self._on(f.inputs["noise"]).float() for f in items]
            times = [1.0] * len(items)
        else:
            x = [euler_step(self._on(f.inputs["x"]), self.compute_velocity(self._on(f.inputs["hidden"])), self.num_steps)
                 for f in items]
            times = [_next_time(f.iteration, self.num_steps) for f in items]
        return self._tokens(x, times)

    def _tokens(self, xs: list[torch.Tensor], times: list[float]) -> list[dict[str, torch.Tensor]]:
        """x [H_i, 32] at flow time t_i per request -> its x, action tokens [H_i, W] and per-token times [H_i]."""
        sizes = [x.shape[0] for x in xs]
        time = torch.cat([torch.full((n,), t, dtype=torch.float32, device=self.device) for n, t in zip(sizes, times)])
        embeds = self.embed_actions(torch.cat(xs), time)  # [sum H, W], one call for the batch
        return [{"x": x, "embeds": e, "time": t} for x, e, t in zip(xs, embeds.split(sizes), time.split(sizes))]

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The chunk [H, 32] -> the robot's actions [H, action_dim], unnormalised (float32, on the CPU)."""
        chunk = x.detach().float().cpu().numpy()[:, : self.action_dim]
        return torch.from_numpy(np.ascontiguousarray(self.normalizer.action.unnormalize(chunk), dtype=np.float32))

    def _on(self, value: Any) -> torch.Tensor:
        return torch.as_tensor(value).to(self.device)


def _next_time(step: int, num_steps: int) -> float:
    """The flow time after Euler step ``step`` (the time of step + 1; 0 after the last)."""
    times = flow_times(num_steps)
    return times[step + 1] if step + 1 < num_steps else 0.0
